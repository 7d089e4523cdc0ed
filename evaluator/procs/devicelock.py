"""The device lock: one holder at a time per GPU, host-wide, except trusted work that is never
timed, which may share it.

Every process whose device work is timed or runs candidate code (the candidate child, a kept
baseline worker's start, the ncu pass) runs alone on its device, and holds it until its process
is gone (a process that is gone has no device work left: its CUDA context went with it).
A reference worker that only makes outputs (`EvalConfig.reference_hold`: its baselines are
timed by a kept worker under the candidate's hold) takes it shared: such workers overlap one
another, never an exclusive holder, and each is gone before its share is given back.

The lock is a `flock` per device in a lock dir shared by every kloop process of the user on the
host, whatever its cache dir (`isolation.host_lock_dir`; the device named after the physical GPU,
`state.gpu_lock_name`), released by the kernel when a holder dies. Every acquisition opens its
own file description, so threads of one process exclude each other too.

Exclusive holders go first: each announces itself by a shared lock on a second file
(`.writers`) before it waits, and a shared holder must take that file exclusively, for an
instant, before it takes its share. flock grants a lock compatible with the holders whatever
waits, so a stream of shared holders never keeps a timing waiting; shared holders queue until
no exclusive holder waits, then go together (the outputs of several evaluations made at once,
in one gap between timings).
CPU runs are not serialised: their host-clock timings are labelled not comparable anyway.
"""

from __future__ import annotations

import contextlib
import fcntl
from collections.abc import Iterator
from pathlib import Path


@contextlib.contextmanager
def device_lock(device: str, lock_dir: Path, shared: bool = False) -> Iterator[None]:
    """Hold `device` alone (or, `shared`, beside other shared holders only) among every process
    and thread that names the same `lock_dir`."""
    if device == "cpu":
        yield
        return
    lock_dir.mkdir(parents=True, exist_ok=True)
    base = device.replace(":", "_")
    with open(lock_dir / f"{base}.lock", "a") as f, open(lock_dir / f"{base}.writers", "a") as w:
        if shared:
            fcntl.flock(w, fcntl.LOCK_EX)  # granted only while no exclusive holder waits or holds
            try:
                fcntl.flock(f, fcntl.LOCK_SH)
            finally:
                fcntl.flock(w, fcntl.LOCK_UN)
        else:
            fcntl.flock(w, fcntl.LOCK_SH)  # from now on, no new shared holder
            fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)
            fcntl.flock(w, fcntl.LOCK_UN)
