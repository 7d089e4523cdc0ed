"""Build slots: how many compile children run at once on this host, across kloop processes.

Builds run on the CPU ahead of the GPU (they never hold the device lock), so a run keeps the GPU
fed by having more evaluations in flight than the GPU can time at once. Without a bound, a run
at concurrency 32 would start 32 nvcc builds on 16 cores and every one would finish late. A slot
is an exclusive `flock` on one of `slots` files in the harness-private lock dir (the kernel
releases it if its holder dies); a build waits for any free slot.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import time
from collections.abc import Iterator
from pathlib import Path


def default_slots() -> int:
    """Half the cores this process may use, at least one: a build keeps two or three busy (g++ on
    the binding file beside nvcc's two chains, `evaluator.build.nvcc_parallel`), each for part of it."""
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cores = os.cpu_count() or 1
    return max(1, cores // 2)


@contextlib.contextmanager
def build_slot(lock_dir: Path, slots: int, poll_s: float = 0.05) -> Iterator[int]:
    """Hold one of `slots` build slots (its index) for the block."""
    lock_dir.mkdir(parents=True, exist_ok=True)
    files = [open(lock_dir / f"build-{i}.lock", "a") for i in range(slots)]  # noqa: SIM115
    try:
        delay = poll_s
        while True:
            for i, f in enumerate(files):
                try:
                    fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    continue
                try:
                    yield i
                finally:
                    fcntl.flock(f, fcntl.LOCK_UN)
                return
            time.sleep(delay)
            delay = min(delay * 1.5, 0.5)
    finally:
        for f in files:
            f.close()
