"""The template process children are forked from (trusted: it runs no candidate code).

Python, torch and kloop's worker modules are imported here once, and the device is never
touched (a process that has initialised CUDA cannot be forked safely). Each reference,
candidate or compile child is then a fork of this process: the 3-7 s of a fresh interpreter's
imports (5-7 s for `import torch` alone on the H200 VM) become a fork of a few milliseconds,
and the child initialises the device itself after the harness takes the device lock.

    python -m evaluator.worker.zygote SOCKET_FD

Requests come on a Unix SEQPACKET socket whose other end only the harness holds
(`evaluator.procs.forkserver`): one packet per child, a `ForkRequest` as JSON with the child's fds
(stdin, stdout, stderr, then the fds it is passed) attached as SCM_RIGHTS. The answer is one
packet: the child's pid, or `error: ...`. The child is forked twice (the middle process exits
at once), so it is re-parented to the harness, a child subreaper, which waits for it as for any
child of its own. In the child, before `evaluator.worker.child.main` runs: its own session, its
fds at the numbers the request names and no other fd open, the request's working directory and
environment, and the request's uid/gid.
"""

from __future__ import annotations

import ctypes
import errno
import fcntl
import os
import socket
import sys
import tempfile
import traceback

from kloop.evaluator.common.protocol import ForkRequest, GrantRequest

_MAX_FDS = 16
_HIGH_FD = 256
_START_DIR = os.getcwd()
_MAX_PACKET = 1 << 20
_PR_SET_DUMPABLE = 4


def preload() -> None:
    """What every child needs, imported once here (never anything that touches the device)."""
    import numpy  # noqa: F401
    import torch  # noqa: F401

    # torch.profiler's first session (the candidate's profile stage, launch counts) and
    # torch.compile import it, with sympy: 3-7 s on the H200, else paid in every child, under
    # the exclusive device lock. Imports touch no device (`_driver_initialised` checks).
    import torch._dynamo  # noqa: F401

    _import_cpp_extension()
    import kloop.evaluator.worker.candidate  # noqa: F401
    import kloop.evaluator.worker.child  # noqa: F401
    import kloop.evaluator.worker.reference_worker  # noqa: F401
    import kloop.evaluator.worker.serve  # noqa: F401


def _import_cpp_extension() -> None:
    """`torch.utils.cpp_extension` (kloop's build cache wraps its `load_inline` in every child
    that imports a candidate), imported here with `torch.cuda.is_available` answering True: at
    import it asks only to word a log line (`_find_cuda_home`), and the real question would
    initialise the driver. In a child built ahead that first query, made while its device is
    hidden, would leave torch sure there is no GPU for the rest of its life (on the H200,
    2026-12-03 at 5f9de52: every candidate built ahead was judged again under the lock)."""
    import torch

    real = torch.cuda.is_available
    torch.cuda.is_available = lambda: True
    try:
        import torch.utils.cpp_extension  # noqa: F401
    finally:
        torch.cuda.is_available = real


def serve(sock: socket.socket) -> None:
    while True:
        try:
            data, fds, _flags, _addr = socket.recv_fds(sock, _MAX_PACKET, _MAX_FDS)
        except OSError:
            return
        if not data:
            return
        if data.startswith(b'{"grant"'):
            for fd in fds:
                os.close(fd)
            sock.send(_grant(data))
            continue
        try:
            req = ForkRequest.model_validate_json(data)
            if len(fds) != len(req.fd_targets):
                raise ValueError(f"{len(fds)} fds for {len(req.fd_targets)} targets")
            pid = _fork(req, fds, sock)
            answer = str(pid).encode()
        except Exception as e:  # the harness falls back to a plain start
            answer = f"error: {type(e).__name__}: {e}".encode()
        finally:
            for fd in fds:
                os.close(fd)
        sock.send(answer)


def _fork(req: ForkRequest, fds: list[int], sock: socket.socket) -> int:
    r, w = os.pipe()
    middle = os.fork()
    if middle == 0:  # the middle process: fork the child and leave at once
        try:
            os.close(r)
            if req.userns and not _enter_userns():
                os._exit(0)  # no pid: the harness starts it the plain way and flags it
            if req.own_pids and _libc().unshare(_CLONE_NEWPID) != 0:
                print(f"kloop: no PID namespace for the child: errno {ctypes.get_errno()}",
                      file=sys.stderr)
            pid = os.fork()
            if pid == 0:
                os.close(w)
                _become_child(req, fds, sock)  # never returns
            os.write(w, str(pid).encode())
        finally:
            os._exit(0)
    os.close(w)
    os.waitpid(middle, 0)
    with os.fdopen(r, "rb") as f:
        text = f.read().decode()
    if not text:
        raise RuntimeError("the fork failed")
    return int(text)


def _grant(data: bytes) -> bytes:
    """`GrantRequest`, in a throwaway fork: joining a mount namespace changes the caller's root
    and cwd for good, and this process must stay where it is."""
    try:
        req = GrantRequest.model_validate_json(data)
        ns = os.open(f"/proc/{req.grant}/ns/mnt", os.O_RDONLY)
    except Exception as e:
        return f"error: {type(e).__name__}: {e}".encode()
    pid = os.fork()
    if pid == 0:
        code = 0
        try:
            libc = _libc()
            if libc.setns(ns, _CLONE_NEWNS) != 0:
                code = 100 + ctypes.get_errno()
            else:
                for path in req.paths:
                    # EINVAL: nothing covers it (the hide failed, and the child saw that).
                    if libc.umount2(path.encode(), _MNT_DETACH) != 0 and \
                            ctypes.get_errno() != errno.EINVAL:
                        code = 100 + ctypes.get_errno()
        finally:
            os._exit(code)
    os.close(ns)
    _, status = os.waitpid(pid, 0)
    code = os.waitstatus_to_exitcode(status)
    return b"ok" if code == 0 else f"error: setns or umount failed: errno {code - 100}".encode()


def _become_child(req: ForkRequest, fds: list[int], sock: socket.socket) -> None:
    try:
        sock.close()
        os.setsid()
        # Out of the way first, so no target number overwrites a source still to be placed.
        high = [fcntl.fcntl(fd, fcntl.F_DUPFD, _HIGH_FD) for fd in fds]
        for fd in fds:
            os.close(fd)
        for src, dst in zip(high, req.fd_targets, strict=True):
            os.dup2(src, dst, inheritable=dst <= 2)
        keep = set(req.fd_targets)
        for fd in _open_fds():
            if fd not in keep:
                try:
                    os.close(fd)
                except OSError:
                    pass
        os.chdir(req.cwd)
        if sys.path and sys.path[0] == _START_DIR:  # as `python -m` in req.cwd would have it
            sys.path[0] = req.cwd
        os.environ.clear()
        os.environ.update(req.env)
        tempfile.tempdir = None  # TMPDIR is the child's own
        sys.dont_write_bytecode = True
        _libc_dumpable(1)  # the template is not dumpable; its children are, as if exec'd
        if req.hide or req.keep:
            _contain(req)
        if req.userns:  # root in its own user namespace only: give that up too
            from kloop.evaluator.common.linux import CONFINE_ENV

            os.environ[CONFINE_ENV] = "caps"
        if req.gid is not None:
            os.setgroups([])
            os.setgid(req.gid)
        if req.uid is not None:
            os.setuid(req.uid)
        threads = req.env.get("OMP_NUM_THREADS")
        if threads and threads.isdigit():  # OpenMP read the variable when torch was imported
            import torch

            torch.set_num_threads(int(threads))
        sys.argv = list(req.argv)
        from kloop.evaluator.worker.child import main

        rc = main(sys.argv)
    except SystemExit as e:
        rc = e.code if isinstance(e.code, int) else 1
    except BaseException:
        traceback.print_exc()
        rc = 1
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    finally:
        os._exit(rc)


_CLONE_NEWNS, _CLONE_NEWPID = 0x00020000, 0x20000000
_CLONE_NEWNET, _CLONE_NEWIPC = 0x40000000, 0x08000000
_CLONE_NEWUSER = 0x10000000
_MNT_DETACH = 2
_SYS_MOUNT_SETATTR = 442  # the same number on x86_64 and aarch64
_AT_FDCWD, _AT_RECURSIVE = -100, 0x8000
_MOUNT_ATTR_RDONLY = 0x1
_MS_NOSUID, _MS_NODEV, _MS_NOEXEC = 0x2, 0x4, 0x8
_MS_BIND, _MS_REC, _MS_PRIVATE = 0x1000, 0x4000, 0x40000
_MS_RDONLY, _MS_REMOUNT = 0x1, 0x20


class _MountAttr(ctypes.Structure):
    _fields_ = [("attr_set", ctypes.c_uint64), ("attr_clr", ctypes.c_uint64),
                ("propagation", ctypes.c_uint64), ("userns_fd", ctypes.c_uint64)]


def _enter_userns() -> bool:
    """A user namespace in which this process's uid and gid are 0 (what `unshare -r` does)."""
    uid, gid = os.getuid(), os.getgid()
    if _libc().unshare(_CLONE_NEWUSER) != 0:
        print(f"kloop: no user namespace for the child: errno {ctypes.get_errno()}",
              file=sys.stderr)
        return False
    try:
        for name, text in (("setgroups", "deny"), ("uid_map", f"0 {uid} 1"),
                           ("gid_map", f"0 {gid} 1")):
            with open(f"/proc/self/{name}", "w") as f:
                f.write(text)
    except OSError as e:
        print(f"kloop: user namespace not mapped: {e}", file=sys.stderr)
        return False
    return True


def userns_usable() -> bool:
    """Whether this (single-threaded, throwaway) process can enter a user namespace and make
    the namespaces `_contain` needs inside it (`isolation.userns_works` asks in a subprocess)."""
    if not _enter_userns():
        return False
    libc = _libc()
    return libc.unshare(_CLONE_NEWNS | _CLONE_NEWPID | _CLONE_NEWNET | _CLONE_NEWIPC) == 0 and \
        libc.mount(b"none", b"/", None, _MS_REC | _MS_PRIVATE, None) == 0


def _set_readonly(libc: ctypes.CDLL, path: str, readonly: bool, recursive: bool) -> bool:
    attr = _MountAttr(_MOUNT_ATTR_RDONLY if readonly else 0, 0 if readonly else _MOUNT_ATTR_RDONLY,
                      0, 0)
    return libc.syscall(_SYS_MOUNT_SETATTR, _AT_FDCWD, path.encode(),
                        _AT_RECURSIVE if recursive else 0, ctypes.byref(attr),
                        ctypes.sizeof(attr)) == 0


def _readonly_but(libc: ctypes.CDLL, writable: list[str]) -> None:
    """Every mount read-only, then `writable` (mount points) writable again: a child that acts
    as the harness's uid can then change nothing of the user's, of kloop's caches or of the run
    records outside its own evaluation's dir."""
    if not _set_readonly(libc, "/", True, True):
        print(f"kloop: the file tree left writable: errno {ctypes.get_errno()}", file=sys.stderr)
        return
    for path in writable:
        if not _set_readonly(libc, path, False, True):
            print(f"kloop: {path} left read-only: errno {ctypes.get_errno()}", file=sys.stderr)


def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(None, use_errno=True)


def _contain(req: ForkRequest) -> None:
    """Mount, network and IPC namespaces of our own (before dropping root): each `hide` path
    is /dev/null, the work parent is empty but for our own evaluation's dir, `mask` paths are
    empty, /proc is our PID namespace's. What cannot be done is said on stderr; the child runs
    either way (the harness flags it)."""
    libc = _libc()
    if libc.unshare(_CLONE_NEWNS) != 0 or \
            libc.mount(b"none", b"/", None, _MS_REC | _MS_PRIVATE, None) != 0:
        print(f"kloop: no mount namespace for the child: errno {ctypes.get_errno()}",
              file=sys.stderr)
        return
    # No network and no System V / POSIX IPC shared with anyone: nothing listening on the host
    # (a local service, a cluster's head node, another evaluation's candidate) can be reached,
    # and nothing can be sent out. Loopback inside is down; CUDA and Triton need neither.
    for flag, what in ((_CLONE_NEWNET, "network"), (_CLONE_NEWIPC, "IPC")):
        if libc.unshare(flag) != 0:
            print(f"kloop: no {what} namespace for the child: errno {ctypes.get_errno()}",
                  file=sys.stderr)
    for path in req.hide:
        if libc.mount(b"/dev/null", path.encode(), None, _MS_BIND, None) != 0:
            print(f"kloop: could not hide {path}: errno {ctypes.get_errno()}", file=sys.stderr)
    if req.keep:
        # Opened before anything is mounted over it: binding it back from this descriptor gives
        # the writable original, not a read-only copy of a covering mount.
        fd = os.open(req.keep, os.O_PATH | os.O_DIRECTORY)
        try:
            _scratch(libc)
            if req.private:
                from kloop.evaluator.common.hostview import show_only_needed

                show_only_needed(libc, req.private, _needed(req))
            _keep_only(libc, req.keep, fd)
        finally:
            os.close(fd)
    for path in req.mask:
        if os.path.isdir(path) and libc.mount(b"tmpfs", path.encode(), b"tmpfs",
                                              _MS_NOSUID | _MS_NODEV, b"mode=000,size=4k") != 0:
            print(f"kloop: {path} not masked: errno {ctypes.get_errno()}", file=sys.stderr)
    if req.readonly and req.keep:
        binds = []
        for path in req.writable:  # their own mounts, so they can be writable again below
            if os.path.isdir(path) and libc.mount(path.encode(), path.encode(), None,
                                                  _MS_BIND | _MS_REC, None) == 0:
                binds.append(path)
        _readonly_but(libc, [p for p in (req.keep, "/dev/shm", *binds) if p])
    if req.own_pids and os.getpid() == 1 and \
            libc.mount(b"proc", b"/proc", b"proc", _MS_NOSUID | _MS_NODEV | _MS_NOEXEC, None):
        print(f"kloop: /proc not remounted: errno {ctypes.get_errno()}", file=sys.stderr)
    os.chdir(req.cwd)  # through the new mounts


SHARED_SCRATCH = ("/tmp", "/var/tmp", "/run/lock", "/var/crash")
"""World-writable places found on common hosts (those that exist are made read-only)."""
SHM_SIZE = b"256m"


def _scratch(libc: ctypes.CDLL) -> None:
    """Shared scratch space is neither the child's to fill nor a place to leave something for a
    later candidate: /tmp, /var/tmp and the like are read-only here (its TMPDIR and HOME are in
    its own evaluation's dir), /dev/shm a small tmpfs of its own."""
    for path in SHARED_SCRATCH:
        if os.path.isdir(path) and not os.path.islink(path):
            if libc.mount(path.encode(), path.encode(), None, _MS_BIND | _MS_REC, None) != 0 or \
                    libc.mount(None, path.encode(), None,
                               _MS_BIND | _MS_REMOUNT | _MS_RDONLY, None) != 0:
                print(f"kloop: {path} left writable: errno {ctypes.get_errno()}",
                      file=sys.stderr)
    if os.path.isdir("/dev/shm") and libc.mount(
            b"tmpfs", b"/dev/shm", b"tmpfs", _MS_NOSUID | _MS_NODEV,
            b"mode=1777,size=" + SHM_SIZE) != 0:
        print(f"kloop: /dev/shm left shared: errno {ctypes.get_errno()}", file=sys.stderr)


def _needed(req: ForkRequest) -> list[str]:
    """What a contained child must still reach: every absolute path its environment names,
    the interpreter and its libraries, its evaluation's dir and parent, the `writable` dirs."""
    out = [*req.needed, *req.writable, req.cwd, sys.prefix, sys.base_prefix, sys.exec_prefix,
           os.path.realpath(sys.executable), os.path.dirname(os.path.abspath(__file__))]
    if req.keep:
        out += [req.keep, os.path.dirname(req.keep.rstrip("/"))]
    out += [p for p in sys.path if p and os.path.isabs(p)]
    for value in req.env.values():
        out += [p for p in value.split(os.pathsep) if os.path.isabs(p)]
    return out


def _keep_only(libc: ctypes.CDLL, keep: str, fd: int) -> None:
    parent = os.path.dirname(keep.rstrip("/"))
    if libc.mount(b"tmpfs", parent.encode(), b"tmpfs", _MS_NOSUID | _MS_NODEV,
                  b"mode=0711,size=64k") != 0:
        print(f"kloop: other evaluations' dirs not hidden: errno {ctypes.get_errno()}",
              file=sys.stderr)
        return
    os.mkdir(keep, 0o711)
    if libc.mount(f"/proc/self/fd/{fd}".encode(), keep.encode(), None, _MS_BIND | _MS_REC,
                  None) != 0:
        print(f"kloop: own work dir not bound back: errno {ctypes.get_errno()}",
              file=sys.stderr)


def _open_fds() -> list[int]:
    try:
        return [int(n) for n in os.listdir("/proc/self/fd")]
    except OSError:
        return list(range(3, 1024))


def _libc_dumpable(value: int) -> None:
    try:
        _libc().prctl(_PR_SET_DUMPABLE, value, 0, 0, 0)
    except (OSError, AttributeError):
        pass


def main(argv: list[str]) -> int:
    sock = socket.socket(fileno=int(argv[1]))
    _libc_dumpable(0)  # other processes of our uid cannot read or write this one's memory
    preload()
    if _driver_initialised():
        sock.send(b"refused: the CUDA driver was initialised while importing")
        return 1
    sock.send(b"ready")
    serve(sock)
    return 0


def _driver_initialised() -> bool:
    """Whether the CUDA driver was initialised here (forks of such a process are not safe). A
    driver library that is only mapped is harmless: some torch builds load it at import."""
    try:
        with open("/proc/self/maps") as f:
            if not any("libcuda.so" in line for line in f):
                return False
    except OSError:
        return False
    try:  # already loaded: dlopen returns it without side effects
        cuda = ctypes.CDLL("libcuda.so.1")
    except OSError:
        return True
    ctx = ctypes.c_void_p()
    # CUDA_ERROR_NOT_INITIALIZED (3) when cuInit was never called; this call does not call it.
    return cuda.cuCtxGetCurrent(ctypes.byref(ctx)) != 3


if __name__ == "__main__":
    sys.exit(main(sys.argv))
