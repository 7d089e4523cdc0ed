"""Starting children from the template process (`evaluator.worker.zygote`), harness side.

One template per harness process, started on first use and kept for its lifetime. `spawn`
hands it a child's fds, argv, environment, working directory and uid/gid, and gets back the
pid of a child that is already past its imports; the child is re-parented to the harness (a
child subreaper, `isolation.harden_harness`), so `ForkedProcess` waits for it with `waitpid`
like `subprocess.Popen` does. Where the template cannot be used (not Linux, no subreaper, the
template died or refused), `spawn` returns None and the caller starts the child the plain way:
nothing depends on the template but speed.
"""

from __future__ import annotations

import glob
import logging
import os
import socket
import stat
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import IO

import kloop
from kloop.evaluator.common.protocol import ForkRequest, GrantRequest
from kloop.evaluator.procs import isolation

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Confinement:
    """What a template-forked child is confined to: `zygote.ForkRequest`'s fields of the same
    names (which say what each does), passed through as they are."""

    hide: list[str] = field(default_factory=list)
    keep: str | None = None
    own_pids: bool = False
    mask: list[str] = field(default_factory=list)
    userns: bool = False
    readonly: bool = False
    writable: list[str] = field(default_factory=list)
    private: list[str] = field(default_factory=list)
    needed: list[str] = field(default_factory=list)

_START_TIMEOUT_S = 120.0
_REPLY_TIMEOUT_S = 30.0


class ForkedProcess:
    """The parts of `subprocess.Popen` that `sandbox.Child` uses, for a re-parented child."""

    def __init__(self, pid: int, stdin: IO[bytes], stdout: IO[bytes], stderr: IO[bytes]):
        self.pid = pid
        self.stdin, self.stdout, self.stderr = stdin, stdout, stderr
        self.returncode: int | None = None
        self._lock = threading.Lock()

    def poll(self) -> int | None:
        with self._lock:
            if self.returncode is None:
                try:
                    pid, status = os.waitpid(self.pid, os.WNOHANG)
                except ChildProcessError:  # reaped elsewhere: it is gone, how is unknown
                    self.returncode = -9
                else:
                    if pid:
                        self.returncode = os.waitstatus_to_exitcode(status)
            return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        end = None if timeout is None else time.monotonic() + timeout
        delay = 0.001
        while (rc := self.poll()) is None:
            if end is not None and time.monotonic() > end:
                raise subprocess.TimeoutExpired(str(self.pid), timeout or 0.0)
            time.sleep(delay)
            delay = min(delay * 2, 0.02)
        return rc


class ForkServer:
    def __init__(self, interpret: bool = False) -> None:
        self.interpret = interpret
        """Its children run Triton under the interpreter (`TRITON_INTERPRET=1`, CPU)."""
        self._sock: socket.socket | None = None
        self._proc: subprocess.Popen | None = None
        self._lock = threading.Lock()
        self._broken = False

    def spawn(self, argv: list[str], env: dict[str, str], cwd: Path, fds: list[int],
              targets: list[int], uid: int | None, gid: int | None,
              confine: Confinement | None = None) -> int | None:
        """Fork a child (the caller holds `isolation.SPAWN_LOCK` and registers the pid); None
        when the template cannot do it."""
        with self._lock:
            sock = self._started()
            if sock is None:
                return None
            req = ForkRequest(argv=argv, env=env, cwd=str(cwd), fd_targets=targets, uid=uid,
                              gid=gid, **asdict(confine or Confinement()))
            try:
                socket.send_fds(sock, [req.model_dump_json().encode()], fds)
                sock.settimeout(_REPLY_TIMEOUT_S)
                answer = sock.recv(4096).decode()
            except OSError as e:
                self._fail(f"the template process stopped answering ({e})")
                return None
            if not answer.isdigit():
                log.warning("the template process could not start a child: %s", answer)
                return None
            return int(answer)

    def grant(self, pid: int, paths: list[str]) -> str | None:
        """Uncover `paths` in the mount namespace of `pid`, a child this template forked with
        them hidden (`zygote.GrantRequest`). None when done, else why not."""
        with self._lock:
            sock = self._sock
            if sock is None or self._proc is None or self._proc.poll() is not None:
                return "the template process is gone"
            req = GrantRequest(grant=pid, paths=paths)
            try:
                sock.send(req.model_dump_json().encode())
                sock.settimeout(_REPLY_TIMEOUT_S)
                answer = sock.recv(4096).decode()
            except OSError as e:
                self._fail(f"the template process stopped answering ({e})")
                return f"the template process stopped answering ({e})"
            return None if answer == "ok" else answer

    def _started(self) -> socket.socket | None:
        if self._broken:
            return None
        if self._sock is not None and self._proc is not None and self._proc.poll() is None:
            return self._sock
        if self._sock is not None:
            self._fail("the template process died")
            return None
        if not usable():
            self._broken = True
            return None
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        env = {k: v for k, v in os.environ.items() if k in ("PATH", "LANG", "LC_ALL", "HOME")}
        # No device, and no BLAS thread pool: a fork copies only the forking thread, so the
        # template keeps to one (numpy's OpenBLAS would start one per core at import).
        env.update(PYTHONPATH=kloop.ROOT, PYTHONUNBUFFERED="1",
                   PYTHONDONTWRITEBYTECODE="1", CUDA_VISIBLE_DEVICES="",
                   OPENBLAS_NUM_THREADS="1")
        if self.interpret:
            env["TRITON_INTERPRET"] = "1"
        errors = tempfile.TemporaryFile()  # read only if it fails to start
        try:
            self._proc = subprocess.Popen(
                [sys.executable, "-m", "kloop.evaluator.worker.zygote", str(theirs.fileno())],
                pass_fds=(theirs.fileno(),), env=env, stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL, stderr=errors, start_new_session=True)
            # Ours, in a session of its own: never an escaped process to sweep or to stop
            # beside a candidate's baselines (`isolation.escaped`), whatever its privileges.
            isolation.register(self._proc.pid)
        finally:
            theirs.close()
        ours.settimeout(_START_TIMEOUT_S)
        try:
            ready = ours.recv(256)
        except OSError:
            ready = b""
        if ready != b"ready":
            self._sock = ours
            if self._proc.poll() is None:
                self._proc.kill()
            self._proc.wait()
            errors.seek(0)
            tail = errors.read()[-2000:].decode(errors="replace").strip()
            said = ready.decode(errors="replace") or f"exit code {self._proc.returncode}"
            self._fail(f"the template process did not start ({said})"
                       + (f"; its stderr ends: {tail}" if tail else ""))
            errors.close()
            return None
        errors.close()  # the template keeps its own handle to the (unlinked) file
        self._sock = ours
        return ours

    def _fail(self, why: str) -> None:
        log.warning("%s; children start the plain way from now on", why)
        self._broken = True
        if self._proc is not None:
            if self._proc.poll() is None:
                self._proc.kill()
            isolation.unregister(self._proc.pid)
        if self._sock is not None:
            self._sock.close()


GPU_NODES = "/dev/nvidia*"


def gpu_nodes() -> list[str]:
    """The GPU's device nodes (character devices) on this machine."""
    out = []
    for path in sorted(glob.glob(GPU_NODES)):
        try:
            if stat.S_ISCHR(os.stat(path).st_mode):
                out.append(path)
        except OSError:
            pass
    return out


def usable() -> bool:
    """Linux, and the harness is a child subreaper (so forked children come back to it)."""
    if not sys.platform.startswith("linux") or not hasattr(socket, "send_fds"):
        return False
    isolation.harden_harness()
    return isolation.is_subreaper()


# Two templates: Triton is imported in the template (torch._dynamo imports it), and whether its
# own @jit functions (tl.sigmoid, tl.cdiv, ...) are compiled or interpreted is decided at that
# import; children on a GPU need the one, children under TRITON_INTERPRET=1 the other.
_SERVERS = {False: ForkServer(), True: ForkServer(interpret=True)}


def server(env: dict[str, str]) -> ForkServer:
    """The template for a child with this environment: Triton native, or interpreted."""
    return _SERVERS[env.get("TRITON_INTERPRET") == "1"]
