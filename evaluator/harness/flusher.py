"""The L2 flush before every timed call, done by a trusted process (`l2_flush: trusted`).

With `l2_flush: worker` the serving process flushes in its `prep`, which in a candidate's
process is the candidate's to skip (native code can, and then its weights stay in L2 for the
timed calls). Here the flush is done by `evaluator.worker.flush_worker`, a process of the
harness's that runs no candidate code, on the same device: the harness sends the worker its
`prep`, asks the flusher for a flush, waits for it, and only then starts its clock.

One flusher per device per harness process, started on first use (its CUDA start-up is paid
once) and kept; if it dies it is started again, and if it cannot be, the evaluation fails as
an infrastructure fault (never a timing without the flush it promised).
"""

from __future__ import annotations

import atexit
import os
import select
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from kloop.evaluator.procs import isolation

_START_S = 120.0
_FLUSH_S = 10.0


class FlushFailed(RuntimeError):
    """The trusted flusher could not be started or stopped answering."""


class Flusher:
    def __init__(self, device: str, env: dict[str, str]):
        self.device, self.env = device, env
        self._proc: subprocess.Popen | None = None
        self._req = self._rep = -1
        self._lock = threading.Lock()
        self.flushes = 0
        self.persisting_reset: bool | None = None
        """Whether the driver accepted the last reset of persisting L2 lines (None: none yet)."""

    def flush(self) -> None:
        """One flush, done when this returns; raises `FlushFailed`."""
        with self._lock:
            for attempt in (0, 1):
                if self._proc is None or self._proc.poll() is not None:
                    self._start()
                try:
                    os.write(self._req, b"f")
                    answer = self._read(_FLUSH_S)
                except (OSError, FlushFailed) as e:
                    self._stop()
                    if attempt:
                        raise FlushFailed(f"the L2 flusher stopped answering ({e})") from None
                    continue
                self.flushes += 1
                self.persisting_reset = answer == b"k"
                return

    def _start(self) -> None:
        self._stop()
        req_r, self._req = os.pipe()
        self._rep, rep_w = os.pipe()
        try:
            with isolation.SPAWN_LOCK:
                self._proc = subprocess.Popen(
                    # It sees only its GPU (child_env), as device 0.
                    [sys.executable, "-m", "kloop.evaluator.worker.flush_worker",
                     "cpu" if self.device == "cpu" else "cuda:0", str(req_r), str(rep_w)],
                    pass_fds=(req_r, rep_w), env=self.env, cwd=self.env.get("HOME", "/"),
                    stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL, start_new_session=True)
                isolation.register(self._proc.pid)
        finally:
            os.close(req_r)
            os.close(rep_w)
        if self._read(_START_S) != b"r":
            self._stop()
            raise FlushFailed("the L2 flusher did not start")

    def _read(self, timeout_s: float) -> bytes:
        end = time.monotonic() + timeout_s
        while True:
            left = end - time.monotonic()
            if left <= 0:
                raise FlushFailed(f"no answer in {timeout_s:g} s")
            if select.select([self._rep], [], [], left)[0]:
                data = os.read(self._rep, 1)
                if not data:
                    raise FlushFailed("the flusher exited")
                return data

    def _stop(self) -> None:
        if self._proc is not None:
            if self._proc.poll() is None:
                self._proc.kill()
            self._proc.wait()
            isolation.unregister(self._proc.pid)
            self._proc = None
        for fd in (self._req, self._rep):
            if fd >= 0:
                os.close(fd)
        self._req = self._rep = -1

    def close(self) -> None:
        with self._lock:
            self._stop()


_flushers: dict[str, Flusher] = {}
_guard = threading.Lock()


def flusher(device: str) -> Flusher:
    """This harness's flusher for `device` (`cpu` or `cuda:N`)."""
    from kloop.evaluator.procs.sandbox import child_env

    with _guard:
        if device not in _flushers:
            home = Path(tempfile.mkdtemp(prefix="kloop-flusher-"))
            _flushers[device] = Flusher(device, child_env(home, device))
        return _flushers[device]


@atexit.register
def _close_all() -> None:
    for f in list(_flushers.values()):
        f.close()
