"""Where this process's evaluations are, for progress displays: how many wait for a build slot,
build, wait for their device (its lock), or hold it. Counts only; nothing here decides anything."""

from __future__ import annotations

import contextlib
import threading
from collections import Counter
from collections.abc import Iterator

PHASES = ("build_wait", "build", "queued", "device_wait", "device")
"""`queued`: static checks and build done, waiting for one of the scheduler's device slots
(`evaluator.procs.scheduler`); `device_wait`: in a device stage, waiting for the device lock."""
_guard = threading.Lock()
_counts: Counter[str] = Counter()


@contextlib.contextmanager
def phase(name: str) -> Iterator[None]:
    enter(name)
    try:
        yield
    finally:
        leave(name)


def enter(name: str) -> None:
    """One more evaluation in `name` (for a phase that starts and ends on different threads)."""
    with _guard:
        _counts[name] += 1


def leave(name: str) -> None:
    with _guard:
        _counts[name] -= 1


def snapshot() -> dict[str, int]:
    with _guard:
        return {p: _counts[p] for p in PHASES if _counts[p] > 0}


def describe() -> str:
    """`building 2 · waiting for the device 3 · on the device 1` (empty: nothing in flight)."""
    words = {"build_wait": "waiting to build", "build": "building",
             "queued": "built, queued for the device",
             "device_wait": "waiting for the device", "device": "on the device"}
    return " · ".join(f"{words[p]} {n}" for p, n in snapshot().items())
