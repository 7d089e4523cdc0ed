"""Child processes: spawn, scrubbed environment, per-stage timeouts, memory watchdog, bounded output.

Every piece of candidate code runs in a fresh `python -m evaluator.worker.child` process started in its
own session (so the whole process group can be killed), with an environment built from an
allow-list. The child reports typed JSON lines on a dedicated pipe; stdout and stderr are only
kept as bounded tails for error reports. Anything the child fails to report (segfault,
`os._exit`, a kill) is read from its exit status by the caller.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from pydantic import BaseModel, ConfigDict, ValidationError

import kloop
from kloop.evaluator.common import linux
from kloop.evaluator.common.protocol import (
    MESSAGE,
    ChildMessage,
    ChildMode,
    Control,
    ReadyMsg,
    StageMsg,
)
from kloop.evaluator.harness import cores
from kloop.evaluator.harness.clock import CallChannel
from kloop.evaluator.procs import isolation
from kloop.evaluator.procs.forkserver import Confinement
from kloop.evaluator.procs.isolation import SandboxPlan

log = logging.getLogger(__name__)

KLOOP_ROOT = Path(kloop.ROOT)
"""What children get as their PYTHONPATH: the directory holding the `kloop` package."""
ENV_ALLOW = (
    "PATH", "LANG", "LC_ALL", "LC_CTYPE", "TZ", "CUDA_HOME", "CUDA_PATH", "TORCH_CUDA_ARCH_LIST",
    "LD_LIBRARY_PATH", "CC", "CXX", "MAX_JOBS", "OMP_NUM_THREADS", "MKL_NUM_THREADS",
    "KLOOP_CUDA_EXTRA_INCLUDE",
)
ENV_ALLOW_PREFIXES = ("TRITON_",)
# Defence in depth: even an allowed name is dropped when it looks like a credential.
SECRET_NAME = re.compile(r"KEY|TOKEN|SECRET|PASSW|CREDENTIAL|AUTH", re.IGNORECASE)
_MAX_LINE = 8 << 20
_POLL_S = 0.05


def child_env(home: Path, device: str, extra: dict[str, str] | None = None) -> dict[str, str]:
    """The whole environment of a child: allow-listed names from ours, plus what we set.

    `device` is `cpu` (no GPU visible) or `cuda:N` (only GPU N visible, as `cuda:0` inside).
    """
    env = {
        k: v
        for k, v in os.environ.items()
        if (k in ENV_ALLOW or k.startswith(ENV_ALLOW_PREFIXES)) and not SECRET_NAME.search(k)
    }
    env.pop("TRITON_INTERPRET", None)  # set per child below, never inherited
    tmp = home / "tmp"
    tmp.mkdir(parents=True, exist_ok=True)
    # USER/LOGNAME: a sandbox uid has no passwd entry, and getpass.getuser() (torch's cache
    # dirs) would fail looking for one.
    env.update(HOME=str(home), TMPDIR=str(tmp), PYTHONPATH=str(KLOOP_ROOT), USER="kloop",
               LOGNAME="kloop",
               PYTHONUNBUFFERED="1", PYTHONDONTWRITEBYTECODE="1")
    env["CUDA_VISIBLE_DEVICES"] = visible_device(device)
    # The probe trials of a candidate with kernels of its own count them under torch.profiler;
    # without a CUPTI teardown afterwards every later launch in that process stays slower (a
    # launch-bound forward 1.49x after one profiler session, 1.02x with this; bench/cupti.py on
    # the H200), which the reference worker, never profiled, does not pay.
    env["TEARDOWN_CUPTI"] = "1"
    env.update(extra or {})
    return env


def visible_device(device: str) -> str:
    if device == "cpu":
        return ""
    index = int(device.split(":")[1]) if ":" in device else 0
    inherited = os.environ.get("CUDA_VISIBLE_DEVICES")
    if inherited:
        visible = [d.strip() for d in inherited.split(",") if d.strip()]
        if index < len(visible):
            return visible[index]
    return str(index)


class ChildOutcome(BaseModel):
    """How a child process ended, as seen from outside."""

    model_config = ConfigDict(extra="forbid")

    returncode: int | None
    signal: str | None = None
    killed_for: str | None = None
    """`timeout`, `memory` or `disk` when the harness killed it."""
    stage: str
    """The last stage the child announced (`startup` before any)."""
    stage_limit_s: float | None = None
    stdout_tail: str = ""
    stderr_tail: str = ""
    wall_s: float
    bad_lines: int = 0
    """Lines on the result pipe that were not valid messages."""


class _Tail:
    def __init__(self, limit: int):
        self.limit = limit
        self.buf = bytearray()

    def feed(self, chunk: bytes) -> None:
        self.buf += chunk
        if len(self.buf) > 2 * self.limit:
            del self.buf[: len(self.buf) - self.limit]

    def text(self) -> str:
        return bytes(self.buf[-self.limit :]).decode("utf-8", "replace")


class Child:
    """One running child; use as a context manager so it is always killed and reaped. It starts
    as a fork of the template process (`evaluator.procs.forkserver`) where that works, else as a fresh
    interpreter."""

    def __init__(self, mode: ChildMode, job: BaseModel, workdir: Path, env: dict[str, str],
                 timeouts: dict[str, float], rss_limit_bytes: int | None, tail_bytes: int,
                 sandbox: SandboxPlan | None = None, serves: bool = False,
                 confine: Confinement | None = None,
                 disk: DiskLimit | None = None,
                 on_uncontained: Callable[[], None] | None = None, ahead: bool = False):
        self.mode, self.workdir, self.env = mode, workdir, env
        self.ahead = ahead
        """A candidate child built ahead: it starts at SCHED_IDLE with `confine.hide` covered,
        and `grant` gives both back once the harness holds the device lock for it."""
        self.retry: str | None = None
        """Why this child's candidate must be judged again in a new child (built ahead: its work
        before the lock failed, or the device could not be given to it)."""
        self.said_ahead = False
        """A child started `ahead` said it built before the lock (`ReadyMsg.ahead`); one that
        found itself within reach of the device waited for the lock to build instead."""
        self.forked = False
        self.disk = disk
        """How much the child may write under `disk.root` (its evaluation's dir)."""
        self.on_uncontained = on_uncontained
        """Called when `hide`/`keep` were asked for but the child had to start the plain way
        (no template process): it then runs without them, and the result must say so."""
        self.confine = confine or Confinement()
        """Namespaces and mounts of a template-forked child (`zygote.ForkRequest`): a compile
        child runs candidate code outside the device lock, so the GPU's device nodes are hidden
        from it; a contained child sees only its own evaluation's dir, in a PID namespace of
        its own."""
        self.calls: CallChannel | None = CallChannel.open() if serves else None
        """The trusted clock's call channel (`evaluator.harness.clock`) when the child serves."""
        self.sandbox = sandbox
        self.timeouts = timeouts
        self.rss_limit = rss_limit_bytes
        self.tails = (_Tail(tail_bytes), _Tail(tail_bytes))
        self.job_path = workdir / f"job_{mode}.json"
        isolation.write_new(self.job_path, job.model_dump_json())
        self._queue: queue.Queue[ChildMessage | None] = queue.Queue()
        self._lock = threading.Lock()
        self._stage = "startup"
        self._deadline = 0.0
        self._killed_for: str | None = None
        self._bad_lines = 0
        self._threads: list[threading.Thread] = []
        self._pending: list[ChildMessage | None] = []
        self.ready_at: float | None = None
        """When the child said it was ready (time.monotonic), if it did."""
        self.cores: frozenset[int] | None = None
        """Where it runs from its start (`harness.cores`: the rest, for children outside the
        device lock); None: where the harness runs."""

    def __enter__(self) -> Child:
        read_fd, write_fd = os.pipe()
        self._t0 = time.monotonic()
        self._hard_deadline = self._t0 + sum(self.timeouts.values())
        self._set_stage("startup")
        isolation.harden_harness()
        identity = self._identity()
        argv = [sys.executable, "-m", "kloop.evaluator.worker.child", self.mode, str(self.job_path),
                str(write_fd)]
        fds: tuple[int, ...] = (write_fd,)
        if self.calls is not None:
            argv.append(",".join(map(str, self.calls.child_fds())))
            fds += self.calls.child_fds()
        try:
            with isolation.SPAWN_LOCK:
                forked = self._forked(fds, identity)  # None: the plain way
                self.forked = forked is not None
                if forked is None and (self.confine.hide or self.confine.keep) and \
                        self.on_uncontained:
                    self.on_uncontained()
                self.proc = forked or subprocess.Popen(
                    argv, cwd=self.workdir, env=self.env, stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE, stderr=subprocess.PIPE, pass_fds=fds,
                    start_new_session=True, **identity,
                )
                isolation.register(self.proc.pid)
                cores.place(self.proc.pid, self.cores)
        finally:
            os.close(write_fd)
            if self.calls is not None:
                self.calls.spawned()
        self._spawn(self._read_messages, os.fdopen(read_fd, "rb"))
        self._spawn(self._read_tail, self.proc.stdout, self.tails[0])
        self._spawn(self._read_tail, self.proc.stderr, self.tails[1])
        self._spawn(self._watch)
        return self

    def _forked(self, fds: tuple[int, ...], identity: dict):
        """The child as a fork of the template process, its fds at 0-2 and then 3, 4, ...
        in the order of `fds` (the argv names them so); None to start it the plain way."""
        from kloop.evaluator.procs import forkserver

        pipes = [os.pipe() for _ in range(3)]
        theirs = [pipes[0][0], pipes[1][1], pipes[2][1]]
        numbers = list(range(3, 3 + len(fds)))
        argv = ["kloop.evaluator.worker.child", self.mode, str(self.job_path), str(numbers[0])]
        if len(numbers) > 1:
            argv.append(",".join(map(str, numbers[1:])))
        try:
            pid = forkserver.server(self.env).spawn(
                argv, self.env, self.workdir, theirs + list(fds), [0, 1, 2] + numbers,
                identity.get("user"), identity.get("group"), self.confine)
        finally:
            for fd in theirs:
                os.close(fd)
        if pid is None:
            for fd in (pipes[0][1], pipes[1][0], pipes[2][0]):
                os.close(fd)
            return None
        return forkserver.ForkedProcess(pid, os.fdopen(pipes[0][1], "wb"),
                                        os.fdopen(pipes[1][0], "rb"), os.fdopen(pipes[2][0], "rb"))

    def __exit__(self, *exc) -> None:
        self._kill_group()
        self._reap()
        for t in self._threads:
            t.join(timeout=5)
        if self.calls is not None:
            self.calls.close()

    def kill(self, reason: str) -> None:
        """Kill the child now (the harness saw it break a rule or run out of time)."""
        self._kill(reason)

    def _identity(self) -> dict:
        plan = self.sandbox
        if plan is None:
            return {}
        if plan.drop_caps:
            self.env[linux.CONFINE_ENV] = "caps"
        if plan.uid is None:
            return {}
        return {"user": plan.uid, "group": plan.gid, "extra_groups": []}

    def _reap(self) -> int:
        """Wait for the leader, then kill whatever escaped its process group."""
        rc = self.proc.wait()
        isolation.unregister(self.proc.pid)
        if self.sandbox is not None:
            isolation.reap_orphans()
        return rc

    def messages(self) -> Iterator[ChildMessage]:
        """Messages in order, until the child closes the pipe (exits or is killed)."""
        while self._pending:
            msg = self._pending.pop(0)
            if msg is None:
                return
            yield msg
        while (msg := self._queue.get()) is not None:
            yield msg

    def wait_ready(self) -> bool:
        """Wait for the child's first message, `ready` (started, imported, not on the device
        yet). False when it ended or said anything else first (`messages` still yields it)."""
        msg = self._queue.get()
        if isinstance(msg, ReadyMsg):
            self.ready_at = time.monotonic()
            self.said_ahead = msg.ahead
            if self.ahead and msg.retry is not None:
                self.retry = f"its work before the lock failed: {msg.retry}"
            return True
        self._pending.append(msg)
        return False

    def grant(self) -> str | None:
        """Give a child built ahead what it was kept from before the lock: its hidden paths (the
        GPU's device nodes), uncovered in its mount namespace by the template that forked it,
        and SCHED_OTHER for its threads. None when done, else why not."""
        from kloop.evaluator.procs import forkserver

        if self.confine.hide and self.forked:
            why = forkserver.server(self.env).grant(self.proc.pid, list(self.confine.hide))
            if why is not None:
                return why
        return isolation.foreground(self.proc.pid)

    @contextlib.contextmanager
    def paused(self) -> Iterator[None]:
        """The child's time limits stand still while the harness waits (for the device lock):
        a child kept waiting is not late."""
        t0 = time.monotonic()
        with self._lock:
            deadline, self._deadline = self._deadline, math.inf
        try:
            yield
        finally:
            waited = time.monotonic() - t0
            with self._lock:
                self._hard_deadline += waited
                self._deadline = min(deadline + waited, self._hard_deadline)

    def send(self, control: Control) -> None:
        try:
            assert self.proc.stdin is not None
            self.proc.stdin.write(control.model_dump_json().encode() + b"\n")
            self.proc.stdin.flush()
        except (BrokenPipeError, OSError):
            log.debug("child %s gone before control %s", self.proc.pid, control.next)

    def outcome(self) -> ChildOutcome:
        """Wait for the child to end (the watchdog enforces the limits) and describe it."""
        self.proc.wait()
        self._kill_group()
        rc = self._reap()
        for t in self._threads:
            t.join(timeout=5)
        with self._lock:
            stage, killed = self._stage, self._killed_for
        sig = signal.Signals(-rc).name if rc < 0 and -rc in signal.Signals._value2member_map_ else None
        return ChildOutcome(
            returncode=rc, signal=sig, killed_for=killed, stage=stage,
            stage_limit_s=self.timeouts.get(stage), stdout_tail=self.tails[0].text(),
            stderr_tail=self.tails[1].text(), wall_s=time.monotonic() - self._t0,
            bad_lines=self._bad_lines,
        )

    # ---- internals --------------------------------------------------------------------------

    def _spawn(self, fn, *args) -> None:
        t = threading.Thread(target=fn, args=args, daemon=True)
        t.start()
        self._threads.append(t)

    def _set_stage(self, stage: str) -> None:
        with self._lock:
            self._stage = stage
            limit = self.timeouts.get(stage, self.timeouts["startup"])
            self._deadline = min(time.monotonic() + limit, self._hard_deadline)

    def _read_messages(self, pipe) -> None:
        with pipe:
            while line := pipe.readline(_MAX_LINE):
                if not line.endswith(b"\n"):
                    while (rest := pipe.readline(_MAX_LINE)) and not rest.endswith(b"\n"):
                        pass
                    self._bad_lines += 1
                    continue
                try:
                    msg = MESSAGE.validate_json(line)
                except ValidationError:
                    self._bad_lines += 1
                    continue
                if isinstance(msg, StageMsg):
                    self._set_stage(msg.stage)
                self._queue.put(msg)
        self._queue.put(None)

    @staticmethod
    def _read_tail(stream, tail: _Tail) -> None:
        with stream:
            while chunk := stream.read1(65536):
                tail.feed(chunk)

    def _watch(self) -> None:
        while self.proc.poll() is None:
            with self._lock:
                late = time.monotonic() > self._deadline
            if late:
                self._kill("timeout")
                break
            if self.rss_limit is not None and _rss_bytes(self.proc.pid) > self.rss_limit:
                self._kill("memory")
                break
            if self.disk is not None and self.disk.exceeded():
                self._kill("disk")
                break
            time.sleep(_POLL_S)
        # The leader is gone (or killed): whatever it left behind goes with it, including
        # processes that left its group, which may hold the result pipe open.
        self._kill_group()
        if self.sandbox is not None:
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass
            isolation.reap_orphans()

    def _kill(self, reason: str) -> None:
        with self._lock:
            self._killed_for = reason
        log.info("killing child %s (%s) in stage %s: %s", self.proc.pid, self.mode,
                 self._stage, reason)
        self._kill_group()

    def _kill_group(self) -> None:
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


class DiskLimit:
    """At most `limit` bytes (or `max_files` entries) under `root`. Measuring a tree is not
    free, so it is measured only once the filesystem's free space (or free inodes) has fallen by
    half the limit since the last look: a child that writes little costs one `statvfs` a poll."""

    def __init__(self, root: Path, limit: int, max_files: int = 200_000):
        self.root, self.limit, self.max_files = root, limit, max_files
        self._last = _free(root)

    def exceeded(self) -> bool:
        now = _free(self.root)
        if now is None or self._last is None:
            return False
        (space, inodes), (last_space, last_inodes) = now, self._last
        if last_space - space < self.limit // 2 and last_inodes - inodes < self.max_files // 2:
            # Space that came back (another evaluation cleaned up) raises the mark.
            self._last = (max(space, last_space), max(inodes, last_inodes))
            return False
        self._last = now
        return _tree_bytes(self.root, self.limit, self.max_files) > self.limit


def _free(path: Path) -> tuple[int, int] | None:
    """(bytes, inodes) free to an unprivileged writer on `path`'s filesystem."""
    try:
        st = os.statvfs(path)
    except OSError:
        return None
    return st.f_bavail * st.f_frsize, st.f_favail


def _tree_bytes(root: Path, stop_above: int, max_files: int) -> int:
    """Allocated bytes under `root` (not following links), counted until past `stop_above`;
    more than `max_files` entries counts as past it."""
    total, seen, todo = 0, 0, [str(root)]
    while todo:
        try:
            entries = os.scandir(todo.pop())
        except OSError:
            continue
        with entries:
            for e in entries:
                seen += 1
                if seen > max_files:
                    return stop_above + 1
                try:
                    st = e.stat(follow_symlinks=False)
                except OSError:
                    continue
                total += st.st_blocks * 512
                if total > stop_above:
                    return total
                if e.is_dir(follow_symlinks=False):
                    todo.append(e.path)
    return total


def _rss_bytes(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError):
        pass
    return 0
