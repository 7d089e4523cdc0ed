"""Quiet cores for timed work: the harness's timing thread and the processes it times run on
cores of their own; builds and children outside the device lock run on the rest.

Why: a launch-bound model's time is CPU time of the process that launches it. On the H200 host
(16 cores, GPU_VALIDATION.md 2026-12-05) identical code read 0.88-1.15x of itself at L3/4's full
size (0.9 ms), each evaluation's paired interval narrow but their centres apart: each pair of
processes landed on its own cores, beside its own neighbours (compile children, other
evaluations' CPU work, the harness's other threads). With a fixed pair of serving cores every
evaluation's processes run where the last one's did.

The plan needs room: at least `MIN_CORES` cores in the harness's affinity (a 2-core CI host gets
none, and everything runs where it ran before). `kloop check` shows the plan.
"""

from __future__ import annotations

import contextlib
import functools
import os
from collections.abc import Iterator
from dataclasses import dataclass

MIN_CORES = 8


@dataclass(frozen=True)
class QuietCores:
    timer: int
    """The harness thread that runs the served calls' loop (`harness.paired`, `harness.served`)."""
    serving: frozenset[int]
    """The processes being timed: the lock holder's children (the reference worker and the
    candidate child take turns in a paired round, so two cores are enough for both)."""
    rest: frozenset[int]
    """Everything else kloop starts: compile and prime children, children before the lock."""


@functools.lru_cache(maxsize=1)
def plan() -> QuietCores | None:
    """The last three cores of the harness's affinity (the first ones take the host's
    interrupts and other processes' defaults first), or None where there are too few."""
    if os.environ.get("KLOOP_QUIET_CORES", "auto") == "off":
        return None
    try:
        cores = sorted(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return None
    if len(cores) < MIN_CORES:
        return None
    return QuietCores(timer=cores[-1], serving=frozenset(cores[-3:-1]),
                      rest=frozenset(cores[:-3]))


def place(pid: int, cores: frozenset[int] | None) -> str | None:
    """Every thread of `pid` onto `cores` (threads started later inherit their creator's).
    None when done (or nothing to do), else why not."""
    if not cores:
        return None
    from kloop.evaluator.procs.isolation import each_thread

    return each_thread(pid, lambda tid: os.sched_setaffinity(tid, cores))


@contextlib.contextmanager
def timing_thread() -> Iterator[None]:
    """The calling thread on the timer core inside the block, where it was after."""
    q = plan()
    if q is None:
        yield
        return
    before = os.sched_getaffinity(0)  # pid 0: this thread (Linux)
    os.sched_setaffinity(0, {q.timer})
    try:
        yield
    finally:
        os.sched_setaffinity(0, before)
