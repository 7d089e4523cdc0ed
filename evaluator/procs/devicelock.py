"""The device lock: one holder at a time per GPU, host-wide.

Every process whose device work is timed or judged (the reference worker, the candidate child,
the ncu pass) runs alone on its device, and holds it until its process is gone (a process that
is gone has no device work left: its CUDA context went with it).

The lock is an exclusive `flock` per device in a lock dir shared by every kloop process of the
user on the host, whatever its cache dir (`isolation.host_lock_dir`; the device named after the
physical GPU, `state.gpu_lock_name`), released by the kernel when a holder dies. Every
acquisition opens its own file description, so threads of one process exclude each other too.
CPU runs are not serialised: their host-clock timings are labelled not comparable anyway.
"""

from __future__ import annotations

import contextlib
import fcntl
from collections.abc import Iterator
from pathlib import Path


@contextlib.contextmanager
def device_lock(device: str, lock_dir: Path) -> Iterator[None]:
    """Hold `device` alone among every process and thread that names the same `lock_dir`."""
    if device == "cpu":
        yield
        return
    lock_dir.mkdir(parents=True, exist_ok=True)
    with open(lock_dir / f"{device.replace(':', '_')}.lock", "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)
