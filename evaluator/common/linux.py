"""Linux calls and environment names both sides of the trust boundary use: the harness sets
the variables for a child (`evaluator.procs.isolation`, `evaluator.procs.sandbox`), the child
acts on them before any candidate code runs (`evaluator.worker.confine`)."""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import sys

PR_GET_DUMPABLE, PR_SET_DUMPABLE = 3, 4
PR_CAPBSET_DROP = 24
PR_SET_CHILD_SUBREAPER = 36
PR_GET_CHILD_SUBREAPER = 37
PR_SET_NO_NEW_PRIVS = 38
PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL = 47, 4
CAP_VERSION_3 = 0x20080522
CONFINE_ENV = "KLOOP_CONFINE"
"""Set by the harness in a sandboxed child's environment: `caps` = drop all capabilities."""
BECOME_ENV = "KLOOP_BECOME"
"""`uid:gid` for a child that another program starts as root (the ncu pass: ncu starts it),
so the harness cannot give it the sandbox identity itself: it takes it on, first thing."""
BACKGROUND_ENV = "KLOOP_BACKGROUND"
"""Set for children that run candidate code outside the device lock (compile children): they
run SCHED_IDLE and cannot leave it, so they get no CPU time a timed process wants."""


@functools.lru_cache(maxsize=1)
def libc() -> ctypes.CDLL | None:
    if not sys.platform.startswith("linux"):
        return None
    return ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)


def prctl(option: int, arg: int = 0) -> int:
    c = libc()
    if c is None:
        return -1
    return int(c.prctl(option, ctypes.c_ulong(arg), ctypes.c_ulong(0), ctypes.c_ulong(0),
                          ctypes.c_ulong(0)))


def available_bytes(meminfo: str | None = None) -> int | None:
    """The host memory available to new work (/proc/meminfo's MemAvailable), None if unread.
    `meminfo`: that file's text."""
    from pathlib import Path

    try:
        text = meminfo if meminfo is not None else Path("/proc/meminfo").read_text()
        kib = next(int(line.split()[1]) for line in text.splitlines()
                   if line.startswith("MemAvailable:"))
    except (OSError, StopIteration, ValueError, IndexError):
        return None
    return kib << 10
