"""The child side of isolation: what a child that will run candidate code does to itself
first, before importing it. `confine_child()` takes on the sandbox identity the harness named
(`BECOME_ENV`), goes to SCHED_IDLE for good where asked (`BACKGROUND_ENV`), sets no_new_privs
(inherited by every descendant and never cleared: it also marks a process as sandbox-born for
`evaluator.procs.isolation.reap_orphans`) and drops every capability where asked
(`CONFINE_ENV`)."""

from __future__ import annotations

import ctypes
import logging
import os
import resource
from pathlib import Path

from kloop.evaluator.common.linux import (
    BACKGROUND_ENV,
    BECOME_ENV,
    CAP_VERSION_3,
    CONFINE_ENV,
    PR_CAP_AMBIENT,
    PR_CAP_AMBIENT_CLEAR_ALL,
    PR_CAPBSET_DROP,
    PR_SET_NO_NEW_PRIVS,
)
from kloop.evaluator.common.linux import libc as _libc
from kloop.evaluator.common.linux import prctl as _prctl

log = logging.getLogger(__name__)


# ---- child side ---------------------------------------------------------------------------


class _CapHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _CapData(ctypes.Structure):
    _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32),
                ("inheritable", ctypes.c_uint32)]


def _drop_capabilities(libc: ctypes.CDLL) -> None:
    try:
        last = int(Path("/proc/sys/kernel/cap_last_cap").read_text())
    except (OSError, ValueError):
        last = 63
    # The bounding set first (needs CAP_SETPCAP, which the capset below removes): with it empty
    # an exec as root cannot regain anything.
    for cap in range(last + 1):
        _prctl(PR_CAPBSET_DROP, cap)
    _prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL)
    header = _CapHeader(CAP_VERSION_3, 0)
    data = (_CapData * 2)()
    if libc.capset(ctypes.byref(header), data) != 0:
        raise OSError(ctypes.get_errno(), "capset failed")


def _become(spec: str) -> None:
    uid, gid = (int(x) for x in spec.split(":"))
    os.setgroups([])
    os.setgid(gid)
    os.setuid(uid)  # from root: every capability goes with it
    if os.getuid() != uid or os.geteuid() != uid:
        raise SystemExit("kloop: the sandbox identity was not taken on")


def _background() -> None:
    """SCHED_IDLE for every thread, and RLIMIT_NICE 0 so that none can go back: leaving
    SCHED_IDLE needs a nice value within RLIMIT_NICE (or CAP_SYS_NICE, dropped or never held)."""
    resource.setrlimit(resource.RLIMIT_NICE, (0, 0))
    for tid in os.listdir("/proc/self/task"):
        try:
            os.sched_setscheduler(int(tid), os.SCHED_IDLE, os.sched_param(0))
        except OSError as e:  # a thread that ended meanwhile
            log.debug("SCHED_IDLE for thread %s: %s", tid, e)


def confine_child() -> None:
    """In a child that will run candidate code, before importing it (see module doc)."""
    libc = _libc()
    if libc is None:
        return
    become = os.environ.pop(BECOME_ENV, "")
    if become:
        _become(become)
    if os.environ.pop(BACKGROUND_ENV, ""):
        _background()
    if _prctl(PR_SET_NO_NEW_PRIVS, 1) != 0:
        log.warning("could not set no_new_privs (errno %d)", ctypes.get_errno())
    if os.environ.pop(CONFINE_ENV, "") == "caps":
        _drop_capabilities(libc)
