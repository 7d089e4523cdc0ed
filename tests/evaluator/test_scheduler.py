"""evaluator.procs.scheduler: front stages (static checks, builds) run ahead of the device stages.

The scheduler is real here, and so are the runs it creates (work dirs, sandbox uids, device
claims) and their results; the stages are probes that record what ran when, and wait on each
other through events, so every ordering asserted is forced, never a race won by timing.
`evaluate_many` on real stages is exercised by test_broken_candidates.py and
test_triton_aot_cpu.py (and on the GPU by test_gpu_candidates.py)."""

from __future__ import annotations

import threading
import time

import pytest

from kloop.evaluator.common.config import EvalConfig
from kloop.evaluator.common.result import ErrorInfo
from kloop.evaluator.harness.outcome import Decided
from kloop.evaluator.procs import board
from kloop.evaluator.procs.scheduler import Scheduler

WAIT_S = 20  # a probe that waits this long means the scheduler serialised what it should not


class Probes:
    """Front and device stages that log (stage, source) and can be held back per source."""

    def __init__(self) -> None:
        self.log: list[tuple[str, str]] = []
        self.front_done: dict[str, threading.Event] = {}
        self.entered_device: dict[str, threading.Event] = {}
        self.hold_front: dict[str, threading.Event | QueuedForDevice] = {}
        self.hold_device: dict[str, threading.Event] = {}
        self.status: dict[str, str] = {}  # a status the front stage gives (a compile error)
        self.fail: set[str] = set()  # sources whose device stage raises (an evaluator fault)
        self.active = 0
        self.most_active = 0
        self._lock = threading.Lock()

    def done(self, name: str) -> threading.Event:
        return self.front_done.setdefault(name, threading.Event())

    def entered(self, name: str) -> threading.Event:
        return self.entered_device.setdefault(name, threading.Event())

    def front(self, run, before) -> list:
        name = run.source
        with self._lock:
            self.active += 1
            self.most_active = max(self.most_active, self.active)
            self.log.append(("front", name))
        if name in self.hold_front:
            assert self.hold_front[name].wait(WAIT_S), f"{name}'s front stage was never released"
        found = [Decided(status=self.status[name], stage="static")] if name in self.status else []
        self.done(name).set()
        return found

    def device(self, run, before) -> list:
        name = run.source
        with self._lock:
            self.log.append(("device", name))
        self.entered(name).set()
        if name in self.hold_device:
            assert self.hold_device[name].wait(WAIT_S), f"{name}'s device stage was never released"
        with self._lock:
            self.active -= 1
        if name in self.fail:
            raise RuntimeError(f"reference failure on {name}")
        return [Decided(status="correct", stage="done")]

    def stages(self):
        return (self.front,), (self.device,)

    def order(self, stage: str) -> list[str]:
        return [n for s, n in self.log if s == stage]


CPU = EvalConfig(device="cpu")


def _run(probes: Probes, sources: list[str], device_slots: int, ahead: int):
    with Scheduler(device_slots, ahead, stages=probes.stages()) as sched:
        futures = [sched.submit("L3/1", s, CPU) for s in sources]
    return futures


def test_a_build_runs_while_the_candidate_ahead_of_it_is_on_the_device():
    p = Probes()
    # "first" stays on the device until "second" has finished its front stage: with one
    # device slot and nothing run ahead, "second" would start only after "first" left.
    p.hold_device["first"] = p.done("second")
    p.hold_front["second"] = p.entered("first")
    futures = _run(p, ["first", "second"], device_slots=1, ahead=1)
    assert [f.result().status for f in futures] == ["correct", "correct"]
    assert p.log.index(("front", "second")) < p.log.index(("device", "second"))
    assert p.order("device") == ["first", "second"]


class QueuedForDevice:
    """Waits (like an Event) for `after`, then until a run waits in the device queue, as the
    progress board counts it. A probe's own `done` is set inside the front stage, before the
    scheduler hands the run on, so waiting on that would leave the hand-off order to a race."""

    def __init__(self, after: threading.Event) -> None:
        self.after = after

    def wait(self, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        if not self.after.wait(timeout):
            return False
        while not board.snapshot().get("queued"):
            if time.monotonic() > deadline:
                return False
            time.sleep(0.005)
        return True


def test_candidates_reach_the_device_in_the_order_their_builds_finish_and_return_in_input_order():
    p = Probes()
    p.hold_device["a"] = p.done("b")  # a holds the only device slot until both b and c are built
    # b's build is the slow one: it ends once a is on the device and c waits in the queue
    p.hold_front["b"] = QueuedForDevice(after=p.entered("a"))
    p.hold_front["c"] = p.entered("a")
    futures = _run(p, ["a", "b", "c"], device_slots=1, ahead=2)
    assert p.order("device") == ["a", "c", "b"]
    assert [f.result().status for f in futures] == ["correct"] * 3


def test_evaluations_in_flight_are_bounded_by_device_slots_plus_ahead():
    p = Probes()
    futures = _run(p, [f"c{i}" for i in range(12)], device_slots=2, ahead=1)
    assert all(f.result().status == "correct" for f in futures)
    assert 1 <= p.most_active <= 3


def test_a_candidate_that_fails_before_the_device_never_takes_a_device_slot():
    p = Probes()
    p.status["broken"] = "compile_error"
    p.hold_device["slow"] = p.done("broken")  # the only slot is busy while "broken" is built
    futures = _run(p, ["slow", "broken"], device_slots=1, ahead=1)
    assert [f.result().status for f in futures] == ["correct", "compile_error"]
    assert p.order("device") == ["slow"]


def test_an_evaluator_fault_is_that_candidates_exception_and_the_queue_goes_on():
    p = Probes()
    p.fail.add("bad")
    futures = _run(p, ["bad", "ok1", "ok2"], device_slots=1, ahead=0)
    with pytest.raises(RuntimeError, match="reference failure on bad"):
        futures[0].result()
    assert [f.result().status for f in futures[1:]] == ["correct", "correct"]


def test_a_closed_scheduler_takes_no_more_candidates():
    sched = Scheduler(1, 0)
    sched.close()
    with pytest.raises(RuntimeError, match="closed"):
        sched.submit("L3/1", "x = 1", CPU)


def test_the_progress_line_counts_candidates_built_and_queued_for_the_device():
    p = Probes()
    release = threading.Event()
    p.hold_device["a"] = release
    p.hold_front["b"] = p.entered("a")
    with Scheduler(1, 1, stages=p.stages()) as sched:
        futures = [sched.submit("L3/1", s, CPU) for s in ("a", "b")]
        assert QueuedForDevice(after=p.done("b")).wait(WAIT_S)
        assert board.snapshot().get("queued") == 1
        assert "built, queued for the device 1" in board.describe()
        release.set()
    assert [f.result().status for f in futures] == ["correct", "correct"]
    assert "queued" not in board.snapshot()


def test_leaving_on_an_error_cancels_what_has_not_started_and_cleans_it_up():
    from concurrent.futures import CancelledError

    p = Probes()
    release = threading.Event()
    p.hold_device["a"] = release
    with pytest.raises(KeyboardInterrupt):  # noqa: PT012 (the interrupt comes from inside)
        with Scheduler(1, 0, stages=p.stages()) as sched:
            futures = [sched.submit("L3/1", s, CPU) for s in ("a", "b", "c", "d")]
            assert p.entered("a").wait(WAIT_S)
            threading.Timer(0.3, release.set).start()  # "a" finishes once the exit began
            raise KeyboardInterrupt
    assert futures[0].result().status == "correct"  # running: it finishes
    for f in futures[1:]:
        with pytest.raises(CancelledError):
            f.result()
    assert p.order("device") == ["a"] and p.order("front") == ["a"]


class MemoryProbes(Probes):
    """Device stages that run out of device memory as told: `oom[name]` is how many of that
    source's attempts do (`raise_oom`: as the reference's evaluator fault, else as the
    candidate's error); each attempt records how many device stages were active with it."""

    def __init__(self) -> None:
        super().__init__()
        self.oom: dict[str, int] = {}
        self.raise_oom: set[str] = set()
        self.attempts: dict[str, list[int]] = {}
        self.in_device = 0

    def device(self, run, before) -> list:
        name = run.source
        with self._lock:
            self.in_device += 1
            self.attempts.setdefault(name, []).append(self.in_device)
            self.log.append(("device", name))
        self.entered(name).set()
        try:
            if name in self.hold_device:
                assert self.hold_device[name].wait(WAIT_S), f"{name} was never released"
            if len(self.attempts[name]) <= self.oom.get(name, 0):
                msg = "CUDA out of memory. Tried to allocate 8.00 GiB"
                if name in self.raise_oom:
                    raise RuntimeError(f"reference failed in reference: OutOfMemoryError: {msg}")
                return [Decided(status="runtime_error", stage="correctness",
                                error=ErrorInfo(type="OutOfMemoryError", message=msg))]
            return [Decided(status="correct", stage="done")]
        finally:
            with self._lock:
                self.in_device -= 1


@pytest.mark.parametrize("as_reference", [False, True])
def test_running_out_of_device_memory_beside_another_evaluation_is_judged_again_alone(
        as_reference):
    p = MemoryProbes()
    p.oom["hog"] = 1
    if as_reference:
        p.raise_oom.add("hog")
    p.hold_device["hog"] = p.entered("other")  # the two are in their device stages together
    p.hold_device["other"] = p.entered("hog")
    futures = _run(p, ["hog", "other"], device_slots=2, ahead=0)
    hog, other = (f.result() for f in futures)
    assert (hog.status, other.status) == ("correct", "correct")
    assert any(f.startswith("retried_alone") for f in hog.flags)
    assert not any(f.startswith("retried_alone") for f in other.flags)
    assert p.attempts["hog"][0] == 2 or p.attempts["other"][0] == 2  # crowded the first time
    assert p.attempts["hog"][1] == 1  # alone the second time
    assert p.order("front").count("hog") == 2  # from its start: a fresh run


def test_running_out_alone_is_the_candidates_verdict_and_a_false_claim_gets_one_more_run():
    p = MemoryProbes()
    p.oom["alone"] = 5
    futures = _run(p, ["alone"], device_slots=2, ahead=0)
    r = futures[0].result()
    assert r.status == "runtime_error" and r.error.type == "OutOfMemoryError"
    assert p.attempts["alone"] == [1] and not any("retried" in f for f in r.flags)

    # One that says it ran out every time, beside another: judged alone once, then as it is.
    p = MemoryProbes()
    p.oom["liar"] = 5
    p.hold_device["liar"] = p.entered("other")
    p.hold_device["other"] = p.entered("liar")
    liar, other = (f.result() for f in _run(p, ["liar", "other"], device_slots=2, ahead=0))
    assert (liar.status, other.status) == ("runtime_error", "correct")
    assert len(p.attempts["liar"]) == 2 and p.attempts["liar"][1] == 1
    assert any(f.startswith("retried_alone") for f in liar.flags)


def test_device_memory_failures_are_told_apart_by_what_torch_cuda_and_the_driver_say():
    from kloop.evaluator.procs.devicegate import out_of_device_memory

    for said in ("OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 MiB",
                 "RuntimeError: CUDA error: out of memory (cudaErrorMemoryAllocation)",
                 "RuntimeError: CUDA error: out of memory\nCompile with TORCH_USE_CUDA_DSA",
                 "CUBLAS_STATUS_ALLOC_FAILED when calling `cublasCreate(handle)`",
                 "CUDA error: CUBLAS_STATUS_NOT_INITIALIZED when calling `cublasCreate(handle)`",
                 "cuDNN error: CUDNN_STATUS_ALLOC_FAILED"):
        assert out_of_device_memory(said), said
    for said in (None, "", "CUDA error: an illegal memory access was encountered",
                 "RuntimeError: shape mismatch"):
        assert not out_of_device_memory(said), said


def test_a_real_candidate_that_runs_out_is_recognised_by_its_error():
    """Real stages on CPU: torch's own out-of-memory error, raised in the candidate's forward,
    reaches the result in the shape the retry rule reads (alone, it is the verdict)."""
    from eval_helpers import MLP_SMALL

    from kloop.evaluator.procs.devicegate import out_of_device_memory

    source = (
        "import torch\nimport torch.nn as nn\n\n\nclass ModelNew(nn.Module):\n"
        "    def __init__(self, input_size, layer_sizes, output_size):\n"
        "        super().__init__()\n        self.w = nn.Linear(input_size, output_size)\n\n"
        "    def forward(self, x):\n"
        "        raise torch.OutOfMemoryError('CUDA out of memory. Tried to allocate 8.00 GiB')\n")
    with Scheduler(2, 0) as sched:
        r = sched.submit("L3/1", source, EvalConfig(device="cpu",
                                                     problem_overrides=MLP_SMALL)).result()
    assert r.status == "runtime_error" and not any("retried" in f for f in r.flags)
    assert out_of_device_memory(f"{r.error.type}: {r.error.message}")


def test_the_gate_is_the_processes_so_evaluations_outside_a_scheduler_are_retried_too():
    """`kloop run`'s episodes call `evaluate` from threads of their own, not through a
    scheduler: the device half they share is gated the same way."""
    from kloop.evaluator.harness.pipeline import device_half, finish, start

    p = MemoryProbes()
    p.oom["hog"] = 1
    p.hold_device["hog"] = p.entered("other")
    p.hold_device["other"] = p.entered("hog")
    results: dict[str, object] = {}

    def episode(name: str) -> None:
        run = start("L3/1", name, CPU)
        last, findings, error = device_half(run, [], p.stages())
        assert error is None and last is not None
        results[name] = finish(last, findings)

    threads = [threading.Thread(target=episode, args=(n,)) for n in ("hog", "other")]
    for t in threads:
        t.start()
    for t in threads:
        t.join(WAIT_S)
    assert results["hog"].status == "correct" and results["other"].status == "correct"
    assert any(f.startswith("retried_alone") for f in results["hog"].flags)
    assert p.attempts["hog"][1] == 1
