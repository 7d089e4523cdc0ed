"""Baseline workers kept between evaluations of one problem (`evaluator.harness.servers`), on
CPU with real worker processes: the same rounds and checks, one worker start per problem.

What must not change is what a verdict rests on (its attack and honest pair are in
`tests/exploits/test_kept_worker.py`): every timed call is still checked against the
evaluation's own reference worker, and every speedup still comes from paired rounds.
"""

from __future__ import annotations

import math
import os
import signal

import pytest
from eval_helpers import candidate, cpu_config

from kloop.evaluator.harness.pipeline import evaluate
from kloop.evaluator.harness.servers import SERVERS

_MLP = candidate("mlp_torch.py")
CLAIMS_OOM = "import torch\n" + _MLP.replace(
    "    def forward(self, x):\n",
    "    def forward(self, x):\n"
    "        raise torch.OutOfMemoryError('CUDA out of memory. Tried to allocate 80.00 GiB')\n")


pytestmark = pytest.mark.usefixtures("no_kept_workers")


def _paired_eager(result) -> bool:
    """The eager baseline timed in the candidate's rounds (on CPU no speedup is divided: the
    host clock's numbers are not comparable)."""
    return result.paired is not None and result.paired.baselines == ["eager"] and \
        result.paired.rounds >= 2 and result.eager is not None and result.eager.median_ms > 0


def test_one_worker_serves_every_evaluation_of_a_problem_and_a_dead_one_is_replaced(tmp_path):
    config = cpu_config(tmp_path / "cache", kept_baselines=2, baselines="eager")
    started = SERVERS.started
    first = evaluate("L3/1", _MLP, config)
    second = evaluate("L3/1", _MLP, config)
    for r in (first, second):
        assert r.status == "correct", (r.status, r.error, r.flags)
        assert _paired_eager(r), r.paired
    assert SERVERS.started == started + 1 and SERVERS.alive() == 1
    # Its start is the first evaluation's first use, on its clock; the second pays nothing.
    assert first.stage_seconds.get("baseline_server_start", 0) > 0
    assert "baseline_server_start" not in second.stage_seconds

    # A worker that died between evaluations is not used: the next one starts another.
    (server,) = SERVERS._servers.values()
    os.kill(server.run.ref_child.proc.pid, signal.SIGKILL)
    server.run.ref_child.proc.wait()
    third = evaluate("L3/1", _MLP, config)
    assert third.status == "correct" and _paired_eager(third), (third.status, third.flags)
    assert SERVERS.started == started + 2 and SERVERS.alive() == 1


def test_the_least_recently_used_worker_makes_room_and_none_kept_means_the_own_worker(tmp_path):
    config = cpu_config(tmp_path / "cache", kept_baselines=1, baselines="eager")
    started = SERVERS.started
    evaluate("L3/1", _MLP, config)
    other = config.model_copy(update={"problem_overrides": {**config.problem_overrides,
                                                            "batch_size": 3}})
    r = evaluate("L3/1", _MLP, other)  # other sizes: another worker, the first closed
    assert r.status == "correct" and _paired_eager(r)
    assert SERVERS.started == started + 2 and SERVERS.alive() == 1

    SERVERS.close_all()
    own = evaluate("L3/1", _MLP, config.model_copy(update={"kept_baselines": 0}))
    assert own.status == "correct" and _paired_eager(own)
    assert SERVERS.started == started + 2 and SERVERS.alive() == 0


def test_beside_a_kept_worker_the_reference_makes_outputs_only_and_measures_nothing(tmp_path):
    """Where a kept worker times the baselines, the evaluation's own reference worker takes the
    device shared (`EvalConfig.reference_hold`): it makes the outputs every check needs and no
    number of the result is its own; the unpaired eager baseline is the kept worker's, measured
    alone at its start. `exclusive` measures its own, as before."""
    config = cpu_config(tmp_path / "cache", kept_baselines=1, baselines="eager")
    shared = evaluate("L3/1", _MLP, config)
    (server,) = SERVERS._servers.values()
    alone = evaluate("L3/1", _MLP, config.model_copy(update={"reference_hold": "exclusive"}))
    for r in (shared, alone):
        assert r.status == "correct", (r.status, r.error, r.flags)
        assert _paired_eager(r), r.paired
    assert SERVERS.alive() == 1  # the same worker served both
    assert "reference_shared" in shared.stage_seconds, shared.stage_seconds
    assert "reference_held" not in shared.stage_seconds
    assert shared.held_s >= shared.stage_seconds["reference_shared"]
    kept_eager = server.reference.eager.median_ms
    assert shared.paired.unpaired_eager_ms == kept_eager
    assert "reference_held" in alone.stage_seconds and "reference_shared" not in alone.stage_seconds
    assert alone.paired.unpaired_eager_ms is not None
    assert alone.paired.unpaired_eager_ms != kept_eager  # measured by its own worker


def test_out_of_memory_beside_a_kept_worker_is_judged_again_alone_without_one(tmp_path):
    """Kept workers hold device memory: a candidate that ran out while one was alive is judged
    again with every idle one closed and none started (the attack that only claims it ran out
    gets that one retry, as beside another evaluation)."""
    config = cpu_config(tmp_path / "cache", kept_baselines=1, baselines="eager")
    result = evaluate("L3/1", CLAIMS_OOM, config)
    assert result.status == "runtime_error" and result.error.type == "OutOfMemoryError"
    assert sum(f.startswith("retried_alone") for f in result.flags) == 1
    assert SERVERS.alive() == 0


@pytest.mark.gpu
def test_on_a_gpu_the_compiled_baselines_compile_once_per_problem(tmp_path):
    """The default config on a GPU keeps a worker: the second evaluation of a problem pairs all
    three baselines without compiling them again (its warm-up calls are the candidate's and two
    per warm baseline), and its numbers come from the same rounds, with intervals."""
    from eval_helpers import MLP_SMALL

    from kloop.evaluator.common.config import EvalConfig

    config = EvalConfig(device="cuda", cache_dir=tmp_path / "cache", problem_overrides=MLP_SMALL)
    started = SERVERS.started
    first = evaluate("L3/1", _MLP, config)
    second = evaluate("L3/1", _MLP, config)
    for r in (first, second):
        assert r.status == "correct", (r.status, r.error, r.flags)
        assert r.paired is not None and r.paired.baselines == ["eager", "compile", "compile_ro"]
        assert set(r.speedup_ci) == {"eager", "compile", "compile_ro"}, r.speedup_ci
        assert not [f for f in r.flags if f.startswith(("baseline_", "paired_baseline"))], r.flags
    assert SERVERS.started == started + 1
    assert "baseline_server_start" in first.stage_seconds
    assert "baseline_server_start" not in second.stage_seconds
    # Nothing compiles in the second one's warm-up: well under a second at these sizes.
    assert second.stage_seconds["timing_warmup"] < 2.0, second.stage_seconds
    print("first", first.stage_seconds, "second", second.stage_seconds)


@pytest.mark.gpu
def test_on_a_gpu_a_start_held_shared_times_all_three_baselines_alone(tmp_path):
    """`baseline_start_hold: shared` on a GPU: the start compiles torch.compile's two modes
    under a shared hold, then times every role alone; the evaluation pairs all three with
    intervals, and its kept worker held the device alone for less than its whole start."""
    from eval_helpers import MLP_SMALL

    from kloop.evaluator.common.config import EvalConfig

    config = EvalConfig(device="cuda", cache_dir=tmp_path / "cache", problem_overrides=MLP_SMALL,
                        baseline_start_hold="shared")
    r = evaluate("L3/1", _MLP, config)
    assert r.status == "correct", (r.status, r.error, r.flags)
    assert r.paired is not None and r.paired.baselines == ["eager", "compile", "compile_ro"]
    assert set(r.speedup_ci) == {"eager", "compile", "compile_ro"}, r.speedup_ci
    s = r.stage_seconds
    assert s["baseline_server_shared"] > 0 and s["baseline_server_held"] > 0, s
    print("shared start", s)


def test_the_scheduler_shares_kept_workers_across_evaluations_in_flight(tmp_path):
    """Three evaluations at once over three keys (sizes) with room for two workers: pinned
    workers are never closed under an evaluation, one that finds every slot pinned uses its
    own worker, and every verdict is what it is alone."""
    from kloop.evaluator.procs.scheduler import Scheduler

    base = cpu_config(tmp_path / "cache", kept_baselines=2, baselines="eager")
    configs = [base.model_copy(update={"problem_overrides": {**base.problem_overrides,
                                                             "batch_size": b}})
               for b in (2, 3, 4)]
    wrong = _MLP.replace("return F.linear(x, linears[-1].weight, linears[-1].bias)",
                         "return F.linear(x, linears[-1].weight, linears[-1].bias) * 1.5")
    assert wrong != _MLP
    jobs = [(c, src) for _ in range(2) for c in configs for src in (_MLP, wrong)]
    with Scheduler(3, 2) as sched:
        futures = [sched.submit("L3/1", src, c) for c, src in jobs]
    results = [f.result() for f in futures]
    for (_, src), r in zip(jobs, results, strict=True):
        if src is _MLP:
            assert r.status == "correct" and _paired_eager(r), (r.status, r.flags, r.error)
        else:
            assert r.status == "incorrect", (r.status, r.flags)
    assert SERVERS.alive() <= 2


def test_a_kept_worker_does_not_outlive_its_harness(tmp_path):
    """Killed without a word (SIGKILL: no atexit), the harness leaves its kept worker waiting
    on a pipe whose other end is gone: it ends, and with it the device memory it held."""
    import subprocess
    import sys
    import textwrap
    import time
    from pathlib import Path

    script = textwrap.dedent(f'''
        import sys, time
        sys.path.insert(0, {str(Path(__file__).parent)!r})
        from pathlib import Path
        from eval_helpers import candidate, cpu_config
        from kloop.evaluator.harness.pipeline import evaluate
        from kloop.evaluator.harness.servers import SERVERS
        config = cpu_config(Path({str(tmp_path / "cache")!r}), kept_baselines=1,
                            baselines="eager")
        r = evaluate("L3/1", candidate("mlp_torch.py"), config)
        (server,) = SERVERS._servers.values()
        print(r.status, server.run.ref_child.proc.pid, flush=True)
        time.sleep(300)
    ''')
    harness = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        status, pid = harness.stdout.readline().split()
        assert status == "correct"
        os.kill(int(pid), 0)  # alive while its harness is
    finally:
        harness.kill()
        harness.wait()
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if not _running(int(pid)):
            return
        time.sleep(0.2)
    raise AssertionError(f"the kept worker {pid} outlived its harness")


def _running(pid: int) -> bool:
    """Whether `pid` still runs: an exited process nobody has reaped yet (a zombie, held by
    this test process where an earlier test made it a subreaper) holds nothing and counts as
    ended."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return False
    return state not in ("Z", "X")


def test_left_open_as_many_are_kept_as_the_devices_and_the_hosts_memory_leave_room_for():
    """`kept_baselines=None` on a GPU: a worker starts while the device keeps `DEVICE_RESERVE`
    of its memory free and the host `HOST_RESERVE`, each worker still starting counted as
    `STARTING`; never more than `AUTO_MAX`; `ON_GPU` where the memory cannot be read."""
    from kloop.evaluator.harness.servers import (
        AUTO_MAX,
        DEVICE_RESERVE,
        HOST_RESERVE,
        ON_GPU,
        STARTING,
        has_room,
    )

    gib = 1 << 30
    total = 141 * gib  # an H200
    floor = math.ceil(DEVICE_RESERVE * total) + STARTING[0]
    host = 100 * gib
    assert has_room(10, 0, (floor, total), host)
    assert not has_room(10, 0, (floor - 1, total), host)
    # Two starting, not yet allocated: each counts as STARTING until it has.
    assert has_room(10, 2, (floor + 2 * STARTING[0], total), host)
    assert not has_room(10, 2, (floor + 2 * STARTING[0] - 1, total), host)
    assert not has_room(0, 0, (total, total), HOST_RESERVE + STARTING[1] - 1)
    assert not has_room(AUTO_MAX, 0, (total, total), host)
    assert has_room(ON_GPU - 1, 0, None, host) and not has_room(ON_GPU, 0, None, host)
    assert not has_room(ON_GPU, 0, (total, total), None)


def test_a_warm_up_in_the_judging_process_starts_the_kept_workers_its_candidates_use(tmp_path):
    """`warm_up(keep=True)` (a run's or the bench's warm-up): each problem's kept worker starts
    there, timing its baselines once, and the problem's first candidate uses it instead of
    starting one under its own lock hold (first use paid once, not twice)."""
    from kloop.evaluator.tools.warmup import warm_up
    from kloop.problems.registry import get_problem

    config = cpu_config(tmp_path / "cache", kept_baselines=2, baselines="eager")
    started = SERVERS.started
    warmed, _ = warm_up([(get_problem("L3/1"), config)], rebuild=False, keep=True)
    assert warmed[0].error is None and warmed[0].reference.eager is not None
    assert SERVERS.started == started + 1 and SERVERS.alive() == 1
    first = evaluate("L3/1", _MLP, config)
    assert first.status == "correct" and _paired_eager(first), (first.status, first.flags)
    assert "baseline_server_start" not in first.stage_seconds
    assert SERVERS.started == started + 1

    # Where none may be kept, the warm-up times the baselines without keeping a worker.
    SERVERS.close_all()
    none = config.model_copy(update={"kept_baselines": 0})
    warmed, _ = warm_up([(get_problem("L3/1"), none)], rebuild=False, keep=True)
    assert warmed[0].error is None and warmed[0].reference.eager is not None
    assert SERVERS.started == started + 1 and SERVERS.alive() == 0


def test_a_start_held_shared_compiles_first_and_times_its_roles_alone(tmp_path, monkeypatch):
    """`baseline_start_hold: shared`: the kept worker's start serves its roles a few calls under
    a shared hold (nothing measured), parks, then times them alone in one session: the same
    numbers a start held alone makes (eager at the full count, with its handshake), the same
    cache record, and the evaluation that started it judged and paired as before. With a real
    flock lock (as on a GPU): the start's first hold is shared, its timed calls' exclusive."""
    import contextlib

    from kloop.evaluator.harness.reference import BaselineRecord
    from kloop.evaluator.harness.state import EvalRun
    from kloop.evaluator.procs.devicelock import device_lock

    holds: list[bool] = []

    def recording_lock(self, kind="exclusive"):
        @contextlib.contextmanager
        def held():
            with device_lock("cuda:9", tmp_path / "locks", kind) as hold:
                holds.append(kind != "exclusive")
                yield hold
        return held()

    monkeypatch.setattr(EvalRun, "gpu_lock", recording_lock)
    config = cpu_config(tmp_path / "cache", kept_baselines=1, baselines="eager",
                        baseline_start_hold="shared", cpu_timing_trials=5)
    r = evaluate("L3/1", _MLP, config)
    assert r.status == "correct", (r.status, r.error, r.flags)
    assert _paired_eager(r), r.paired
    (server,) = SERVERS._servers.values()
    eager = server.reference.eager
    assert eager is not None and eager.n_trials == 5 and server.reference.handshake_ms
    assert server.roles == ["eager"] and server.shared_s > 0 and server.held_s > 0
    assert r.stage_seconds["baseline_server_shared"] > 0, r.stage_seconds
    # The start's shared hold, then its timed calls alone; then the evaluation's own reference
    # (shared, outputs only) and its candidate (alone).
    assert holds[:2] == [True, False], holds
    records = list((tmp_path / "cache").rglob("baselines/*.json"))
    assert len(records) == 1, records
    rec = BaselineRecord.model_validate_json(records[0].read_text())
    assert rec.eager is not None and rec.eager.median_ms == eager.median_ms


@pytest.mark.slow
def test_a_start_held_shared_times_a_compiled_role_alone_and_a_cached_one_keeps_its_timing(
        tmp_path):
    """The compiled role of a shared start: compiled under the shared hold, timed alone on the
    eager handshake, paired in the rounds; a second start (the first closed) takes its timing
    from the cache record, as a start held alone does."""
    config = cpu_config(tmp_path / "cache", kept_baselines=1, baselines="both",
                        baseline_start_hold="shared", cpu_timing_trials=3)
    first = evaluate("L3/1", _MLP, config)
    assert first.status == "correct", (first.status, first.error, first.flags)
    assert first.paired is not None and first.paired.baselines == ["eager", "compile"]
    (server,) = SERVERS._servers.values()
    compiled = server.reference.compiled
    assert compiled is not None and compiled.n_trials == 3 and server.roles == ["eager", "compile"]
    SERVERS.close_all()
    again = evaluate("L3/1", _MLP, config)
    assert again.status == "correct" and again.paired.baselines == ["eager", "compile"]
    (server,) = SERVERS._servers.values()
    assert server.reference.compiled == compiled  # the cache's, not timed again
