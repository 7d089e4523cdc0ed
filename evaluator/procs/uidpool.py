"""One sandbox uid per evaluation in flight on this host (a root harness's candidate children).

Candidate and compile children of concurrent evaluations used to share one uid, so candidate
code in one evaluation's compile child could write into another's work dir (owned by that uid:
its probe inputs, its construction fills, its source before it is imported) or signal its
processes (stop it while it is timed, kill it): one candidate changing another's verdict. Each
evaluation now leases a uid of its own from a pool of consecutive uids, for its whole life; a
uid is held by an exclusive `flock` on a file in a root-only directory, so kloop processes on
one host never hand out the same uid at once, and a lease whose holder died is free again.
Work dirs given to a uid are mode 0700, and different uids cannot signal each other.
"""

from __future__ import annotations

import fcntl
import logging
import os
import stat
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger(__name__)

_WAIT_S = 600.0
_held: set[int] = set()  # within this process (flock is per open file, not per process)
_held_lock = threading.Lock()


@dataclass
class Lease:
    uid: int
    fd: int | None
    """The open lock file (None: leased within this process only)."""

    def release(self) -> None:
        with _held_lock:
            _held.discard(self.uid)
        if self.fd is not None:
            os.close(self.fd)  # drops the flock
            self.fd = None


def lease_dir() -> Path | None:
    """`<tmp>/kloop-uid-leases`, root's and mode 0700, or None when it cannot be trusted (a
    candidate could have made it first: then leases are exclusive within this process only)."""
    path = Path(tempfile.gettempdir()) / "kloop-uid-leases"
    try:
        path.mkdir(mode=0o700, exist_ok=True)
        st = os.lstat(path)
    except OSError:
        return None
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != 0 or stat.S_IMODE(st.st_mode) != 0o700:
        log.warning("%s is not root's with mode 0700: sandbox uids are leased within this "
                    "process only", path)
        return None
    return path


def lease(base: int, size: int, wait_s: float = _WAIT_S) -> Lease:
    """A uid of `base .. base + size - 1` that no other evaluation on this host holds."""
    where = lease_dir()
    end = time.monotonic() + wait_s
    delay = 0.01
    while True:
        for uid in range(base, base + size):
            got = _try(uid, where)
            if got is not None:
                return got
        if time.monotonic() > end:
            raise RuntimeError(f"all {size} sandbox uids from {base} stayed leased for "
                               f"{wait_s:g} s (raise `sandbox_uids`)")
        time.sleep(delay)
        delay = min(delay * 2, 0.25)


def _try(uid: int, where: Path | None) -> Lease | None:
    with _held_lock:
        if uid in _held:
            return None
        fd = None
        if where is not None:
            fd = os.open(where / f"uid-{uid}.lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                return None
        _held.add(uid)
        return Lease(uid, fd)
