"""Two candidates timed against each other in the same paired rounds (`evaluator.harness.headtohead`),
on CPU: the reference's own code as the challenger, and an incumbent that does the same work and
sleeps 50 ms more per call, or returns a wrong output."""

from __future__ import annotations

import pytest

from kloop.evaluator.common.config import EvalConfig
from kloop.evaluator.harness.pipeline import head_to_head
from kloop.evaluator.harness.precheck import small_overrides
from kloop.problems.registry import get_problem, reference_as_candidate

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def mlp():
    p = get_problem("L3/1")
    src = reference_as_candidate(p.path.read_text())
    cfg = EvalConfig(device="cpu", policy="kernelbench", problem_overrides=small_overrides(p.source))
    return p, src, cfg


def _sleepy(src: str) -> str:
    out = src.replace("import torch\n", "import time\nimport torch\n", 1).replace(
        "    def forward(self, x):\n", "    def forward(self, x):\n        time.sleep(0.05)\n", 1)
    assert out != src
    return out


def test_a_slower_incumbent_reads_slower_with_an_interval_that_excludes_a_tie(mlp):
    p, src, cfg = mlp
    r = head_to_head(p, src, _sleepy(src), cfg)
    h = r.head_to_head
    assert r.status == "correct" and h is not None and h.ratio is not None
    assert h.ratio > 5 and h.low is not None and h.low > 1.0 and h.rounds == 5
    # The other way round, the challenger is the slow one.
    r = head_to_head(p, _sleepy(src), src, cfg)
    assert r.head_to_head is not None and r.head_to_head.high is not None
    assert r.head_to_head.high < 1.0


def test_an_incumbent_with_a_wrong_output_voids_the_comparison_not_the_verdict(mlp):
    p, src, cfg = mlp
    wrong = src.replace("return self.network(x)", "return self.network(x) + 1")
    assert wrong != src
    r = head_to_head(p, src, wrong, cfg)
    assert r.status == "correct"
    assert r.head_to_head is not None and r.head_to_head.ratio is None
    assert "wrong" in (r.head_to_head.note or "")


def test_with_a_kept_baseline_worker_the_incumbent_still_serves_beside_the_challenger(mlp):
    """The rounds' third process (the kept worker, `evaluator.harness.servers`) changes who
    serves the baselines, not the head-to-head: the slower incumbent still reads slower."""
    from kloop.evaluator.harness.servers import SERVERS

    p, src, cfg = mlp
    kept = cfg.model_copy(update={"kept_baselines": 1, "baselines": "eager"})
    try:
        started = SERVERS.started
        r = head_to_head(p, src, _sleepy(src), kept)
        h = r.head_to_head
        assert r.status == "correct" and h is not None and h.low is not None and h.low > 1.0
        assert r.paired is not None and r.paired.baselines == ["eager"]
        assert SERVERS.started == started + 1
    finally:
        SERVERS.close_all()


def test_the_incumbents_process_lives_only_inside_one_hold_of_the_device(mlp, monkeypatch,
                                                                          tmp_path):
    """The incumbent is hostile code that waits while the challenger starts: off the lock, a
    thread of it could launch work into another evaluation's timing. With a real flock lock (as
    on a GPU), every candidate-mode process (incumbent and challenger) is started after the
    hold that covers it was taken and is gone before it is given back, and there is one such
    hold."""
    import contextlib
    import time

    from kloop.evaluator.harness.state import EvalRun
    from kloop.evaluator.procs.devicelock import device_lock

    holds: list[dict] = []
    children: list = []
    spawn = EvalRun.spawn

    def recording_spawn(self, ledger, mode, *args, **kwargs):
        child = spawn(self, ledger, mode, *args, **kwargs)
        children.append((mode, time.monotonic(), child))
        return child

    def recording_lock(self, kind="exclusive"):
        @contextlib.contextmanager
        def held():
            with device_lock("cuda:9", tmp_path / "locks", kind) as hold:
                entry = {"taken": time.monotonic(), "shared": kind != "exclusive"}
                try:
                    yield hold
                finally:
                    entry["live"] = [m for m, _, c in children
                                     if m == "candidate" and c.proc.poll() is None]
                    entry["released"] = time.monotonic()
                    holds.append(entry)
        return held()

    monkeypatch.setattr(EvalRun, "spawn", recording_spawn)
    monkeypatch.setattr(EvalRun, "gpu_lock", recording_lock)
    p, src, cfg = mlp
    r = head_to_head(p, src, _sleepy(src), cfg)
    assert r.status == "correct" and r.head_to_head is not None and r.head_to_head.ratio
    cands = [(t, c) for m, t, c in children if m == "candidate"]
    assert len(cands) == 2, children  # the incumbent's and the challenger's
    (hold,) = [h for h in holds if any(h["taken"] <= t <= h["released"] for t, _ in cands)]
    assert all(hold["taken"] <= t <= hold["released"] for t, _ in cands), (hold, cands)
    assert hold["live"] == [], hold  # both gone before it was given back
    assert "head_to_head_held" in r.stage_seconds and "candidate_held" not in r.stage_seconds


@pytest.mark.gpu
def test_on_a_gpu_the_head_to_head_runs_in_one_hold_and_reads_the_slower_incumbent_slower():
    """The same comparison on a GPU (kept baseline worker, shared reference hold, the real
    device lock): one hold covers both candidate processes, and a 20 ms sleep per call on the
    incumbent's side reads slower with an interval above 1."""
    from eval_helpers import MLP_SMALL

    p = get_problem("L3/1")
    src = reference_as_candidate(p.path.read_text())
    cfg = EvalConfig(device="cuda", policy="kernelbench", problem_overrides=MLP_SMALL)
    slow = _sleepy(src).replace("time.sleep(0.05)", "time.sleep(0.02)")
    r = head_to_head(p, src, slow, cfg)
    h = r.head_to_head
    assert r.status == "correct", (r.status, r.error, r.flags)
    assert h is not None and h.ratio is not None and h.low is not None and h.low > 1.0, h
    s = r.stage_seconds
    assert "head_to_head_held" in s and "candidate_held" not in s, s
    print("head to head", h, s)
