"""evaluator.tools.warmup (what `kloop baseline` runs): several problems at once, in order,
and a reference that runs out of device memory beside another timed again alone."""

from __future__ import annotations

import threading

import pytest

from kloop.evaluator.common.config import EvalConfig
from kloop.evaluator.harness import pipeline
from kloop.evaluator.harness.reference import ReferenceFailure
from kloop.evaluator.tools.warmup import warm_up
from kloop.problems.registry import get_problem

CPU = EvalConfig(device="cpu")


class FakeBaselines:
    """`build_baselines` that records how many ran at once; `oom` ids run out of device memory
    on their first call, while the other problem is inside too."""

    def __init__(self, oom: set[str]) -> None:
        self.oom = oom
        self.inside = 0
        self.calls: dict[str, list[int]] = {}
        self.entered = {pid: threading.Event() for pid in ("L3/1", "L3/4")}
        self.lock = threading.Lock()

    def __call__(self, prob, config, rebuild=True):
        with self.lock:
            self.inside += 1
            self.calls.setdefault(prob.id, []).append(self.inside)
            first = len(self.calls[prob.id]) == 1
        self.entered[prob.id].set()
        try:
            if first:  # both problems inside at once the first time
                other = "L3/4" if prob.id == "L3/1" else "L3/1"
                assert self.entered[other].wait(20)
            if first and prob.id in self.oom:
                raise ReferenceFailure("reference failed in baselines: OutOfMemoryError: CUDA "
                                       "out of memory. Tried to allocate 8.00 GiB")
            return f"baselines of {prob.id}"
        finally:
            with self.lock:
                self.inside -= 1


@pytest.mark.parametrize("oom", [set(), {"L3/4"}])
def test_problems_warm_at_once_and_one_that_ran_out_beside_another_is_timed_again_alone(
        monkeypatch, oom):
    fake = FakeBaselines(oom)
    monkeypatch.setattr(pipeline, "build_baselines", fake)
    heard = []
    jobs = [(get_problem(pid), CPU) for pid in ("L3/1", "L3/4")]
    warmed, wall = warm_up(jobs, concurrency=2, on_done=lambda w: heard.append(w.problem_id))
    assert [w.problem_id for w in warmed] == ["L3/1", "L3/4"]  # the order asked, not finished
    assert sorted(heard) == ["L3/1", "L3/4"] and wall > 0
    assert all(w.reference == f"baselines of {w.problem_id}" and w.error is None
               for w in warmed)
    assert max(fake.calls["L3/1"][0], fake.calls["L3/4"][0]) == 2  # together the first time
    if oom:
        assert fake.calls["L3/4"][1:] == [1]  # again, and alone
    else:
        assert len(fake.calls["L3/4"]) == 1


def test_a_reference_that_fails_otherwise_is_its_row_and_concurrency_must_be_positive(
        monkeypatch):
    def broken(prob, config, rebuild=True):
        raise ReferenceFailure(f"reference failed in reference: ValueError: {prob.id}")

    monkeypatch.setattr(pipeline, "build_baselines", broken)
    (w,), _ = warm_up([(get_problem("L3/1"), CPU)], concurrency=3)
    assert w.reference is None and w.error == "reference failed in reference: ValueError: L3/1"
    with pytest.raises(ValueError, match="at least 1"):
        warm_up([], concurrency=0)


def test_one_that_ran_out_beside_a_kept_baseline_worker_is_timed_again_with_it_closed(
        monkeypatch, tmp_path):
    """Alone among evaluations but beside a kept worker (`harness.servers`), which holds device
    memory too: timed again, with every idle kept worker closed first."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).parent))
    from eval_helpers import candidate, cpu_config

    from kloop.evaluator.harness.servers import SERVERS

    config = cpu_config(tmp_path / "cache", kept_baselines=1, baselines="eager")
    try:
        assert pipeline.evaluate("L3/1", candidate("mlp_torch.py"), config).status == "correct"
        assert SERVERS.alive() == 1
        alive_at: list[int] = []

        def runs_out_once(prob, config, rebuild=True):
            alive_at.append(SERVERS.alive())
            if len(alive_at) == 1:
                raise ReferenceFailure("reference failed in baselines: OutOfMemoryError: CUDA "
                                       "out of memory. Tried to allocate 8.00 GiB")
            return "baselines"

        monkeypatch.setattr(pipeline, "build_baselines", runs_out_once)
        (w,), _ = warm_up([(get_problem("L3/4"), CPU)], concurrency=1)
        assert w.reference == "baselines" and w.error is None
        assert alive_at == [1, 0]  # the second time alone, the kept worker closed
    finally:
        SERVERS.close_all()
