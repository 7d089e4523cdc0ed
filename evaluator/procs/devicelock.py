"""The device lock: who may use a GPU while whom.

Two kinds of holder. An *exclusive* holder (the reference worker, the candidate child, the ncu
pass: every process whose device work is timed or judged) runs alone on the device. A *shared*
holder (the JIT warm-up pass, `stages.warmup_pass`) runs beside other shared holders but never
beside an exclusive one, and holds its share until its process is gone (a process that is gone
has no device work left: its CUDA context went with it). Exclusive holders are preferred: once
one waits, no new shared holder starts, so a stream of warm-ups cannot starve the clock.

Across processes (`lock_dir` given: the host's, `isolation.host_lock_dir`, so every kloop
process of the user on the host, whatever its cache dir; the device named after the physical
GPU, `state.gpu_lock_name`) the lock is two `flock`s per device, released by the kernel when a holder dies: a *gate* that an
exclusive holder takes before it waits (shared holders pass through it one at a time, so none
passes while an exclusive one waits) and the *lock* itself (LOCK_EX or LOCK_SH). Every
acquisition opens its own file description, so threads of one process exclude each other too.
Without `lock_dir` only the evaluations of this process wait for each other (a condition
variable with the same rules). CPU runs are not serialised: their host-clock timings are
labelled not comparable anyway.
"""

from __future__ import annotations

import contextlib
import fcntl
import threading
from collections.abc import Iterator
from pathlib import Path


class _InProcess:
    """The same rules within one process (device_lock = "process")."""

    def __init__(self) -> None:
        self.cond = threading.Condition()
        self.shared = 0
        self.exclusive = False
        self.waiting = 0  # exclusive holders waiting

    @contextlib.contextmanager
    def hold(self, shared: bool) -> Iterator[None]:
        with self.cond:
            if shared:
                self.cond.wait_for(lambda: not self.exclusive and not self.waiting)
                self.shared += 1
            else:
                self.waiting += 1
                try:
                    self.cond.wait_for(lambda: not self.exclusive and not self.shared)
                finally:
                    self.waiting -= 1
                self.exclusive = True
        try:
            yield
        finally:
            with self.cond:
                if shared:
                    self.shared -= 1
                else:
                    self.exclusive = False
                self.cond.notify_all()


_in_process: dict[str, _InProcess] = {}
_guard = threading.Lock()


@contextlib.contextmanager
def _flocked(lock_dir: Path, device: str, shared: bool) -> Iterator[None]:
    lock_dir.mkdir(parents=True, exist_ok=True)
    name = device.replace(":", "_")
    with open(lock_dir / f"{name}.gate", "a") as gate, open(lock_dir / f"{name}.lock", "a") as f:
        fcntl.flock(gate, fcntl.LOCK_EX)
        try:
            if shared:  # passes the gate only while no exclusive holder waits behind it
                fcntl.flock(f, fcntl.LOCK_SH)
            else:  # holds the gate while it waits: no new shared holder gets in meanwhile
                fcntl.flock(f, fcntl.LOCK_EX)
        finally:
            fcntl.flock(gate, fcntl.LOCK_UN)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


@contextlib.contextmanager
def device_lock(device: str, lock_dir: Path | None = None, shared: bool = False) \
        -> Iterator[None]:
    """Hold `device` exclusively (or, `shared`, beside other shared holders only)."""
    if device == "cpu":
        yield
        return
    if lock_dir is not None:
        with _flocked(lock_dir, device, shared):
            yield
        return
    with _guard:
        lock = _in_process.setdefault(device, _InProcess())
    with lock.hold(shared):
        yield
