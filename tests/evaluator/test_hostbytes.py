"""The disk budget for probe-trial outputs: what an evaluation reserves, the room its candidate
child's disk limit leaves for its own outputs, and that reservations past the budget wait for
each other (procs/hostbytes.py, harness/state.py)."""

from __future__ import annotations

import threading
import time
from pathlib import Path

from kloop.evaluator.common.config import EvalConfig
from kloop.evaluator.harness.judge import trial_kinds
from kloop.evaluator.harness.pipeline import outputs_reserved
from kloop.evaluator.harness.state import EvalRun, disk_limit
from kloop.evaluator.procs.hostbytes import AT_LEAST, HostBytes, candidate_bytes, trial_bytes
from kloop.problems.registry import get_problem


def test_only_outputs_of_gigabytes_reserve_and_every_output_of_a_tuple_counts():
    assert trial_bytes(None, 6) == 0
    assert trial_bytes([1, 10], 6) == 0  # LeNet's logits: nothing to reserve
    l3_17 = [128, 128, 256, 256]
    one = 128 * 128 * 256 * 256 * 4
    # six expected outputs, and the candidate's six and its repeated call's
    assert candidate_bytes(l3_17, 6) == 7 * one
    assert trial_bytes(l3_17, 6) == 13 * one
    side = 1 << 25
    assert trial_bytes([[side], [side]], 1) == 3 * 2 * side * 4
    assert trial_bytes([[side]], 1) == 3 * side * 4 >= AT_LEAST
    assert candidate_bytes(None, 6) == 0


def test_an_evaluation_reserves_its_full_size_trials_and_none_at_other_sizes(tmp_path: Path):
    def reserved(problem: str, **overrides) -> tuple[int, int, int]:
        config = EvalConfig(device="cpu", cache_dir=tmp_path / "cache", problem_overrides=overrides)
        run = EvalRun.create(get_problem(problem), "", config)
        try:
            return outputs_reserved(run), disk_limit(run), len(trial_kinds(run))
        finally:
            run.cleanup()

    one = 128 * 128 * 256 * 256 * 4
    base = int(EvalConfig().disk_limit_gb * (1 << 30))
    got, limit, trials = reserved("L3/17")
    assert got == (2 * trials + 1) * one
    # the candidate child's disk limit leaves room for all its own trial outputs at once
    assert limit == base + (trials + 1) * one
    assert reserved("L3/4") == (0, base + 4096 * 20 * 4 * (trials + 1), trials)
    assert reserved("L3/17", batch_size=2)[:2] == (0, base)  # the meta's shape is the full size's


def _hold(budget: HostBytes, n: int, where: Path, log: list, name: str,
          release: threading.Event) -> threading.Thread:
    def body():
        with budget.reserve(n, where):
            log.append(f"{name} in")
            release.wait(10)
        log.append(f"{name} out")

    t = threading.Thread(target=body)
    t.start()
    return t


def _settle(log: list, n: int) -> None:
    deadline = time.monotonic() + 5
    while len(log) < n and time.monotonic() < deadline:
        time.sleep(0.01)
    time.sleep(0.05)


def test_reservations_beyond_the_budget_wait_for_those_that_hold_it(tmp_path: Path):
    budget = HostBytes(total=100)
    log: list[str] = []
    a_go, b_go, c_go = threading.Event(), threading.Event(), threading.Event()
    a = _hold(budget, 60, tmp_path, log, "a", a_go)
    _settle(log, 1)
    c = _hold(budget, 30, tmp_path, log, "c", c_go)  # fits beside a
    _settle(log, 2)
    b = _hold(budget, 60, tmp_path, log, "b", b_go)  # does not: waits for a
    _settle(log, 3)
    assert log == ["a in", "c in"] and budget.held == 90
    a_go.set()
    a.join(5)
    _settle(log, 4)
    assert log[2:] == ["a out", "b in"] and budget.held == 90
    b_go.set(), c_go.set()
    b.join(5), c.join(5)
    assert budget.held == 0


def test_a_reservation_larger_than_the_budget_runs_alone(tmp_path: Path):
    budget = HostBytes(total=100)
    log: list[str] = []
    small_go, big_go = threading.Event(), threading.Event()
    small = _hold(budget, 10, tmp_path, log, "small", small_go)
    _settle(log, 1)
    big = _hold(budget, 500, tmp_path, log, "big", big_go)
    _settle(log, 2)
    assert log == ["small in"]
    small_go.set()
    small.join(5)
    _settle(log, 3)
    assert log == ["small in", "small out", "big in"]
    big_go.set()
    big.join(5)
    with budget.reserve(0, tmp_path):  # nothing to reserve never waits
        assert budget.held == 0


def test_the_budget_is_half_the_work_dirs_free_disk(tmp_path: Path):
    import shutil

    budget = HostBytes()
    got = budget.total(tmp_path)
    free = shutil.disk_usage(tmp_path).free
    assert 0.4 * free < got <= 0.5 * free + (1 << 30)
    assert budget.total(tmp_path) == got  # fixed once taken
