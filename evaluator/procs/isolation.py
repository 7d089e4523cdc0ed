"""Keeping candidate code away from the harness and from later evaluations (Linux; elsewhere a no-op).

Harness side:
- `harden_harness()` (once, before the first child): the harness becomes non-dumpable, so no
  other process without CAP_SYS_PTRACE can read its /proc files (environ, mem, maps), and a child
  subreaper, so a process that escapes its killed process group (double fork, setsid) re-parents
  to the harness instead of init and `reap_orphans()` can find and kill it.
- `plan_sandbox()`: run candidate code under an unprivileged uid/gid when the harness is root
  and everything the child needs (interpreter, packages, kloop, the GPU device nodes) is
  reachable by that uid; else under the harness's uid (the result is flagged
  `isolation_same_uid`), with every capability dropped when that uid is root.
- `reap_orphans()`: SIGKILL and reap what escaped from sandboxed children.

The child side, `confine_child()`, is `evaluator.worker.confine`; the names both sides use
(prctl, the environment variables the harness sets for it) are `evaluator.common.linux`.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import logging
import os
import resource
import signal
import stat
import sys
import sysconfig
import tempfile
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path

from kloop.evaluator.common.linux import (
    BECOME_ENV,
    CONFINE_ENV,
    PR_GET_CHILD_SUBREAPER,
    PR_GET_DUMPABLE,
    PR_SET_CHILD_SUBREAPER,
    PR_SET_DUMPABLE,
)
from kloop.evaluator.common.linux import libc as _libc
from kloop.evaluator.common.linux import prctl as _prctl
from kloop.evaluator.common.vault import VAULT_UID as VAULT_UID
from kloop.evaluator.common.vault import SandboxPlan as SandboxPlan
from kloop.evaluator.common.vault import private_dir as private_dir
from kloop.evaluator.common.vault import vault as _vault
from kloop.evaluator.procs.procwatch import stat_fields

log = logging.getLogger(__name__)

NO_USERNS_ENV = "KLOOP_NO_USERNS"
"""Set (to anything) in a non-root harness's environment: do not contain children in user
namespaces (they then run uncontained, as on a host that forbids user namespaces)."""
FORCE_USERNS_ENV = "KLOOP_FORCE_USERNS"
"""Set in a root harness's environment (with `sandbox_uid: null`): contain children the way a
non-root harness does, in a user namespace (how the CPU tests exercise that path as root)."""
_R, _W, _X = 4, 2, 1
_SWEEP_ROUNDS = 50

# Children the harness spawned and has not reaped yet: never swept. The lock is held while a
# child is being created, so a sweep never sees a new child before it is registered.
SPAWN_LOCK = threading.Lock()
_LIVE: set[int] = set()
_hardened = False


# ---- harness side -------------------------------------------------------------------------


def harden_harness() -> None:
    """Non-dumpable and child subreaper (see module doc); idempotent."""
    global _hardened
    if _hardened or _libc() is None:
        return
    if _prctl(PR_SET_DUMPABLE, 0) != 0:
        log.warning("could not make the harness non-dumpable (errno %d)", ctypes.get_errno())
    if _prctl(PR_SET_CHILD_SUBREAPER, 1) != 0:
        log.warning("could not make the harness a child subreaper (errno %d)", ctypes.get_errno())
    _hardened = True


def is_subreaper() -> bool:
    """Whether orphans of our descendants come back to this process (PR_SET_CHILD_SUBREAPER)."""
    libc = _libc()
    if libc is None:
        return False
    flag = ctypes.c_int(0)
    if libc.prctl(PR_GET_CHILD_SUBREAPER, ctypes.byref(flag), 0, 0, 0) != 0:
        return False
    return bool(flag.value)


def harness_dumpable() -> bool | None:
    return None if _libc() is None else bool(_prctl(PR_GET_DUMPABLE))


def _permits(st: os.stat_result, uid: int, gid: int, want: int) -> bool:
    if uid == st.st_uid:
        bits = (st.st_mode >> 6) & 7
    elif gid == st.st_gid:
        bits = (st.st_mode >> 3) & 7
    else:
        bits = st.st_mode & 7
    return bits & want == want


def reachable(path: Path, uid: int, gid: int, want: int) -> str | None:
    """None when `uid`/`gid` (no capabilities, no supplementary groups) can traverse to `path`
    and use it with `want` (r=4, w=2, x=1); else the first path component that stops it."""
    for p in dict.fromkeys([path.absolute(), path.resolve()]):
        for parent in reversed(p.parents):
            try:
                if not _permits(os.stat(parent), uid, gid, _X):
                    return str(parent)
            except OSError:
                return str(parent)
        try:
            if not _permits(os.stat(p), uid, gid, want):
                return str(p)
        except OSError:
            return str(p)
    return None


def _needed_paths(problem_path: Path) -> list[tuple[Path, int]]:
    import torch

    import kloop
    from kloop import evaluator

    out = [(Path(sys.executable), _X), (Path(os.__file__).parent, _R | _X),
           (Path(sys.prefix), _R | _X), (Path(sys.base_prefix), _R | _X),
           (Path(torch.__file__).parent, _R | _X), (Path(kloop.__file__).parent, _R | _X),
           (Path(evaluator.__file__).parent, _R | _X),
           (problem_path, _R)]
    for key in ("purelib", "platlib"):
        out.append((Path(sysconfig.get_paths()[key]), _R | _X))
    return out


def _device_nodes_usable(uid: int, gid: int) -> str | None:
    for node in sorted(Path("/dev").glob("nvidia*")):
        try:
            st = os.stat(node)
        except OSError:
            continue
        if stat.S_ISCHR(st.st_mode) and not _permits(st, uid, gid, _R | _W):
            return str(node)
    return None


def _first_blocked(paths: Iterable[tuple[Path, int]], uid: int, gid: int) -> str | None:
    for path, want in paths:
        blocked = reachable(path, uid, gid, want)
        if blocked is not None:
            return blocked
    return None


def plan_sandbox(sandbox_uid: int | None, on_gpu: bool, problem_path: Path) -> SandboxPlan:
    """Decide how candidate children run (see module doc): a few stat calls per evaluation."""
    if _libc() is None:
        return SandboxPlan(None, None, False, "not Linux")
    if os.geteuid() != 0:
        return SandboxPlan(None, None, False, "harness is not root")
    needed = _needed_paths(problem_path)
    reason = "sandbox uid disabled in the config"
    if sandbox_uid is not None:
        gid = sandbox_uid
        blocked = _first_blocked(needed, sandbox_uid, gid)
        if blocked is None and on_gpu:
            blocked = _device_nodes_usable(sandbox_uid, gid)
        if blocked is None:
            return SandboxPlan(sandbox_uid, gid, False, f"uid {sandbox_uid}")
        reason = f"uid {sandbox_uid} cannot reach {blocked}"
    # Root without capabilities still owns root's files, but cannot read non-dumpable processes.
    blocked_root = _first_blocked(needed, 0, 0)
    log.info("candidate children run as root (%s)%s", reason,
             "" if blocked_root is None else f"; keeping capabilities: {blocked_root} needs them")
    return SandboxPlan(None, None, blocked_root is None, reason)


def host_lock_dir() -> Path:
    """Where the device lock's files live (`evaluator.procs.devicelock`): one directory per host and
    harness uid, whatever the cache dir, so two runs with different caches never time on one
    GPU at once. `KLOOP_LOCK_DIR` moves it (every process that should wait for another must
    name the same one). Closed like `private_dir`: no candidate can hold a lock."""
    default = Path(tempfile.gettempdir()) / f"kloop-locks-{os.geteuid()}"
    path = Path(os.environ.get("KLOOP_LOCK_DIR") or default)
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    st = os.lstat(path)
    # In a shared /tmp another user could have made it first (to hold our locks, or as a link).
    if not stat.S_ISDIR(st.st_mode) or st.st_uid not in (os.geteuid(), VAULT_UID):
        raise RuntimeError(f"the device lock dir {path} is not a directory of this user's; "
                           "remove it or set KLOOP_LOCK_DIR")
    if os.geteuid() != 0 and stat.S_IMODE(st.st_mode) != 0o700:
        path.chmod(0o700)
    return _vault(path)


def give_to(plan: SandboxPlan, *paths: Path) -> None:
    """Hand harness-created work dirs (recursively, never following links) to the sandbox uid,
    closed to every other uid (another evaluation's candidate runs under another)."""
    if plan.uid is None:
        return
    for top in paths:
        for dirpath, dirnames, filenames in os.walk(top):
            for name in [*dirnames, *filenames]:
                os.chown(os.path.join(dirpath, name), plan.uid, plan.gid, follow_symlinks=False)
        os.chown(top, plan.uid, plan.gid, follow_symlinks=False)
        os.chmod(top, 0o700, follow_symlinks=False)


WORK_DIR = "kloop-work"


_own_parents: dict[Path, Path] = {}


def work_parent(base: Path | None) -> tuple[Path, bool]:
    """Where evaluation dirs are made, and whether children can be contained in it
    (`zygote.ForkRequest.keep`: a root harness). `<base or the temp dir>/kloop-work`, root's and
    mode 0711 (others may pass through to their own dirs, never list them); for a harness that is
    not root, `kloop-work-<uid>`, 0700. One that someone else made first is not used: then this
    process makes one of its own (and other harnesses' dirs are not hidden from its children)."""
    top = base if base is not None else Path(tempfile.gettempdir())
    root = can_change_uid()
    contained = root or userns_works()
    path = top / (WORK_DIR if root else f"{WORK_DIR}-{os.geteuid()}")
    mode = 0o711 if root else 0o700
    try:
        path.mkdir(parents=True, mode=mode, exist_ok=True)
        st = os.lstat(path)
        ours = stat.S_ISDIR(st.st_mode) and st.st_uid == os.geteuid() and \
            not stat.S_IMODE(st.st_mode) & 0o022
    except OSError:
        ours = False
    if not ours:
        if top not in _own_parents:
            log.warning("%s was made by someone else: this process uses a work dir of its own",
                        path)
            _own_parents[top] = Path(tempfile.mkdtemp(prefix=f"{WORK_DIR}-", dir=top))
            _own_parents[top].chmod(mode)
        return _own_parents[top], contained
    if stat.S_IMODE(st.st_mode) != mode:
        path.chmod(mode)
    return path, contained


@functools.lru_cache(maxsize=1)
def userns_works() -> bool:
    """Whether a harness that is not root can contain its children anyway: an unprivileged
    user namespace with mount, PID, network and IPC namespaces inside (some hosts forbid them:
    `kernel.apparmor_restrict_unprivileged_userns`, `user.max_user_namespaces` 0)."""
    if _libc() is None or (os.geteuid() == 0 and not force_userns()) or \
            os.environ.get(NO_USERNS_ENV):
        return False
    import subprocess

    # In a process of its own: a threaded process (this one) cannot enter a user namespace.
    probe = ("from kloop.evaluator.worker.zygote import userns_usable as u; "
             "raise SystemExit(not u())")
    try:
        return subprocess.run([sys.executable, "-c", probe], capture_output=True,
                              timeout=60).returncode == 0
    except (OSError, subprocess.SubprocessError):
        return False


def force_userns() -> bool:
    return bool(os.environ.get(FORCE_USERNS_ENV))


PAGE_LOCK_BYTES = 1 << 30
"""Locked memory a child may hold (RLIMIT_MEMLOCK): room to page-lock its served outputs."""


def allow_page_locked_outputs() -> None:
    """Raise the locked-memory limit that children inherit to `PAGE_LOCK_BYTES`, where this
    process may (root). Both serving processes page-lock the shared output memory
    (`serve._pin`): the reference worker runs as the harness and is never held to the limit,
    a candidate child (a uid without CAP_IPC_LOCK) is, and at the usual 8 MiB a candidate with
    larger outputs paid pageable copies inside the clock that its baseline did not. The
    watchdog still counts locked pages as the child's memory."""
    soft, hard = resource.getrlimit(resource.RLIMIT_MEMLOCK)
    inf = resource.RLIM_INFINITY
    if soft == inf or soft >= PAGE_LOCK_BYTES:
        return
    new_hard = hard if hard == inf or hard >= PAGE_LOCK_BYTES else PAGE_LOCK_BYTES
    try:
        resource.setrlimit(resource.RLIMIT_MEMLOCK, (PAGE_LOCK_BYTES, new_hard))
    except (ValueError, OSError):  # not root: as far as the hard limit goes
        try:
            resource.setrlimit(resource.RLIMIT_MEMLOCK, (hard, hard))
        except (ValueError, OSError):
            pass


CAP_SYS_CHROOT, CAP_SYS_PTRACE, CAP_SYS_ADMIN, CAP_SYS_NICE = 18, 19, 21, 23


def has_capabilities(*caps: int) -> bool:
    """Whether this process holds every one of `caps` (effective set): root in a container
    often lacks some (Docker's default set has none of the four above)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("CapEff:"):
                eff = int(line.split()[1], 16)
                return all(eff >> c & 1 for c in caps)
    except (OSError, ValueError, IndexError):
        pass
    return False


def can_grant() -> bool:
    """Whether the harness can give a child built ahead its device and CPU priority back
    (`EvalConfig.construct_at`): join its mount namespace from the template (SYS_ADMIN,
    SYS_CHROOT; SYS_PTRACE to open it, the child being another uid) and take it out of
    SCHED_IDLE (SYS_NICE)."""
    return can_change_uid() and not force_userns() and has_capabilities(
        CAP_SYS_ADMIN, CAP_SYS_CHROOT, CAP_SYS_PTRACE, CAP_SYS_NICE)


def can_change_uid() -> bool:
    """Whether children can be started under another uid (a root harness on Linux)."""
    return _libc() is not None and os.geteuid() == 0


def register(pid: int) -> None:
    _LIVE.add(pid)


def unregister(pid: int) -> None:
    _LIVE.discard(pid)


def _proc_stat(pid: int) -> tuple[str, int, int] | None:
    """(state, ppid, session id) from /proc/<pid>/stat."""
    fields = stat_fields(pid)
    if fields is None:
        return None
    try:
        return fields[0], int(fields[1]), int(fields[3])
    except (IndexError, ValueError):
        return None


def _status_fields(pid: int) -> dict[str, str]:
    out = {}
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                key, _, value = line.partition(":")
                out[key] = value.strip()
    except OSError:
        pass
    return out


def _sandbox_born(pid: int, me: dict[str, str]) -> bool:
    """A process started under a sandboxed child: another uid than ours, or no_new_privs where
    the harness has none. Without either marker the session test alone decides."""
    st = _status_fields(pid)
    if st.get("Uid", "").split()[:1] != me.get("Uid", "").split()[:1]:
        return True
    if me.get("NoNewPrivs") == "0":
        return st.get("NoNewPrivs") == "1"
    return True


def _orphans(me_pid: int, me_sid: int, me: dict[str, str]) -> list[tuple[int, str]]:
    found = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        pid = int(entry.name)
        info = _proc_stat(pid)
        # Our own helpers (nvidia-smi, ncu, git) share our session; sandboxed children start
        # their own, and nothing can join ours again.
        if info is None or info[1] != me_pid or info[2] == me_sid or pid in _LIVE:
            continue
        if _sandbox_born(pid, me):
            found.append((pid, info[0]))
    return found


def escaped() -> list[int]:
    """Live processes that escaped a sandboxed child and re-parented to the harness (what
    `reap_orphans` kills when an evaluation ends), to stop while a candidate's baselines are
    timed (`harness.paired`); none where the harness is not a subreaper (they went to init)."""
    if _libc() is None or not _hardened:
        return []
    me_pid, me_sid = os.getpid(), os.getsid(0)
    with SPAWN_LOCK:  # a child being created is registered before anyone looks
        return [pid for pid, state in _orphans(me_pid, me_sid, _status_fields(me_pid))
                if state != "Z"]


def reap_orphans() -> int:
    """SIGKILL every process that escaped a sandboxed child and re-parented to the harness (a
    subreaper), and reap it; repeats while killing uncovers more. Returns how many."""
    if _libc() is None or not _hardened:
        return 0
    me_pid, me_sid = os.getpid(), os.getsid(0)
    me = _status_fields(me_pid)
    killed: set[int] = set()
    with SPAWN_LOCK:
        for _ in range(_SWEEP_ROUNDS):
            found = _orphans(me_pid, me_sid, me)
            if not found:
                break
            for pid, state in found:
                if state != "Z":
                    try:
                        os.kill(pid, signal.SIGKILL)
                    except ProcessLookupError:
                        pass
                killed.add(pid)
            time.sleep(0.01)
            for pid, _state in found:
                try:
                    os.waitpid(pid, os.WNOHANG)
                except ChildProcessError:
                    pass
    if killed:
        log.warning("killed %d process(es) that escaped a candidate's process group", len(killed))
    return len(killed)


def identity_env(plan: SandboxPlan | None) -> dict[str, str]:
    """The environment that makes a child started by another program (as the harness's own
    uid) take on `plan`'s identity in `confine_child`."""
    if plan is None:
        return {}
    env = {CONFINE_ENV: "caps"} if plan.drop_caps else {}
    if plan.uid is not None:
        env[BECOME_ENV] = f"{plan.uid}:{plan.gid}"
    return env


def write_new(path: Path, text: str) -> None:
    """Write `path` afresh in a dir candidate code may have written (its evaluation's `cand/`,
    after a child ran there): whatever it left at that name goes first, and the file is created,
    never opened through a link. A root harness that wrote through a symlink planted there
    would write wherever the candidate pointed it."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        pass
    else:
        if stat.S_ISDIR(st.st_mode):
            import shutil

            shutil.rmtree(path)  # fd-based: it does not follow links inside either
        else:
            os.unlink(path)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                 0o644)
    with os.fdopen(fd, "w") as f:
        f.write(text)


def foreground(pid: int) -> str | None:
    """SCHED_OTHER again for every thread of `pid`, a child `_background` put at SCHED_IDLE
    (the harness holds the device lock for it now). Leaving SCHED_IDLE needs CAP_SYS_NICE
    here, as the child cannot do it itself: None when done, else why not."""
    return each_thread(pid, lambda tid: os.sched_setscheduler(tid, os.SCHED_OTHER,
                                                              os.sched_param(0)))


def each_thread(pid: int, apply: Callable[[int], object]) -> str | None:
    """`apply(tid)` for every thread of `pid` (one that ended meanwhile is skipped); None when
    done, else why not."""
    try:
        tids = [int(t) for t in os.listdir(f"/proc/{pid}/task")]
    except OSError as e:
        return f"its threads cannot be listed: {e}"
    for tid in tids:
        try:
            apply(tid)
        except ProcessLookupError:  # a thread that ended meanwhile
            continue
        except OSError as e:
            return f"thread {tid}: {e}"
    return None
