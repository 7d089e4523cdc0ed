"""The device lock: one holder at a time per GPU.

Every process whose device work is timed or judged (the reference worker, the candidate child,
the ncu pass) runs alone on its device, and holds it until its process is gone (a process that
is gone has no device work left: its CUDA context went with it).

Across processes (`lock_dir` given: the host's, `isolation.host_lock_dir`, so every kloop
process of the user on the host, whatever its cache dir; the device named after the physical
GPU, `state.gpu_lock_name`) the lock is an exclusive `flock` per device, released by the kernel
when a holder dies. Every acquisition opens its own file description, so threads of one process
exclude each other too. Without `lock_dir` only the evaluations of this process wait for each
other. CPU runs are not serialised: their host-clock timings are labelled not comparable anyway.
"""

from __future__ import annotations

import contextlib
import fcntl
import threading
from collections.abc import Iterator
from pathlib import Path

_in_process: dict[str, threading.Lock] = {}
_guard = threading.Lock()


@contextlib.contextmanager
def _flocked(lock_dir: Path, device: str) -> Iterator[None]:
    lock_dir.mkdir(parents=True, exist_ok=True)
    with open(lock_dir / f"{device.replace(':', '_')}.lock", "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


@contextlib.contextmanager
def device_lock(device: str, lock_dir: Path | None = None) -> Iterator[None]:
    """Hold `device` alone."""
    if device == "cpu":
        yield
        return
    if lock_dir is not None:
        with _flocked(lock_dir, device):
            yield
        return
    with _guard:
        lock = _in_process.setdefault(device, threading.Lock())
    with lock:
        yield
