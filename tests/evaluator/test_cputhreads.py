"""The harness judges timed outputs on one CPU thread (`evaluator.harness.cputhreads`): a
spinning OpenMP team left by its comparisons would compete with the worker it times."""

from __future__ import annotations

import threading

import torch
from test_trusted_clock import _serve

from kloop.evaluator.harness import cputhreads


def _in_thread(fn):
    """fn() in a fresh thread that first ran a parallel op with two intra-op threads (so its
    OpenMP thread count is its own, as a long-lived harness thread's is)."""
    out: list = []

    def body():
        torch.set_num_threads(2)
        (torch.randn(1 << 20).abs() - 1).max()
        out.append(fn())

    t = threading.Thread(target=body)
    t.start()
    t.join()
    return out[0]


def test_one_cpu_thread_inside_the_block_and_the_callers_setting_after():
    def fn():
        with cputhreads.one_cpu_thread():
            inside = torch.get_num_threads()
        return inside, torch.get_num_threads()

    assert _in_thread(fn) == (1, 2)


def test_every_timed_output_is_judged_on_one_cpu_thread():
    seen: list[int] = []

    def serve():
        _, judged, _ = _serve("honest", [1, 2, 3],
                              observe=lambda i: seen.append(torch.get_num_threads()))
        assert judged == [True] * 3
        return torch.get_num_threads()

    after = _in_thread(serve)
    assert seen == [1, 1, 1]
    assert after == 2


def test_the_candidate_child_gets_one_intra_op_thread_per_serving_core(monkeypatch):
    """The candidate child is moved onto the serving cores under the lock: an OpenMP team
    sized for every core of the host would spin there at every parallel CPU op (the ghost
    trial's comparisons took seconds on the H200). The reference worker keeps torch's default
    (its stage, CPU construction, was slower with one thread per core), and so do compile
    children, on the other cores; without a core plan (a small host) nothing is set."""
    from kloop.evaluator.harness import cores, state

    quiet = cores.QuietCores(timer=15, serving=frozenset({13, 14}), rest=frozenset(range(13)))
    monkeypatch.setattr(cores, "plan", lambda: quiet)
    assert state.lock_holder_threads("candidate") == 2
    assert state.lock_holder_threads("reference") is None
    assert state.lock_holder_threads("compile") is None
    monkeypatch.setattr(cores, "plan", lambda: None)
    assert state.lock_holder_threads("candidate") is None


def test_trials_are_judged_on_the_timer_core_with_one_thread_where_there_is_a_plan(monkeypatch):
    """Where the host has quiet cores, the harness judges the lock holder's trials as it runs
    its served calls: one intra-op thread, on the timer core; the thread's own settings after.
    Without a plan (a small host) nothing changes."""
    import os

    from kloop.evaluator.harness import cores

    allowed = sorted(os.sched_getaffinity(0))
    quiet = cores.QuietCores(timer=allowed[-1], serving=frozenset(allowed[:1]),
                             rest=frozenset(allowed[:1]))

    def fn():
        before = os.sched_getaffinity(0)
        with cputhreads.judging_thread():
            inside = torch.get_num_threads(), os.sched_getaffinity(0)
        return inside, (torch.get_num_threads(), os.sched_getaffinity(0) == before)

    monkeypatch.setattr(cores, "plan", lambda: quiet)
    assert _in_thread(fn) == ((1, {allowed[-1]}), (2, True))
    monkeypatch.setattr(cores, "plan", lambda: None)
    assert _in_thread(fn) == ((2, set(allowed)), (2, True))
