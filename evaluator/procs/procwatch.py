"""A child's threads, CPU time and CPU affinity, sampled from /proc by the harness while the
child serves calls (harness side: nothing the child does in its own process changes them).

The in-process threads probe counts threads after a call returns, and reads module names; a
helper thread started and joined inside every call (a `logging.handlers.QueueListener`) is
gone by then. Here a thread of the harness lists `/proc/<pid>/task` every `interval_s` while the
calls run, and reads the whole process's CPU time (every thread's, those that ended included)
at start and stop: CPU time above wall time means work on more than one core, however short
each thread lived.

    sampler = procwatch.start(child.proc.pid)
    ... the served calls ...
    seen = sampler.stop()   # ProcSample: max_threads, cpu_s, wall_s, max_cpus
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator

from pydantic import BaseModel, ConfigDict

_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
_AFFINITY_EVERY = 10
"""Affinity is read every this many samples (a status file per thread): the sampler's own CPU
time stays small beside a child that is being timed."""


class ProcSample(BaseModel):
    """What the harness saw of one child between `start` and `stop`."""

    model_config = ConfigDict(extra="forbid")

    max_threads: int
    """Most threads listed at once in /proc/<pid>/task (0: the process was never seen)."""
    cpu_s: float | None
    """User and system CPU time of the whole process between start and stop (None: unread)."""
    wall_s: float
    max_cpus: int | None
    """Most CPUs its threads were allowed at once (sched affinity), None: unread."""
    samples: int


def cpu_seconds(pid: int) -> float | None:
    """User and system CPU time of the whole process so far (its ended threads included)."""
    return _cpu_s(pid)


def stat_fields(pid: int) -> list[str] | None:
    """/proc/<pid>/stat's fields after the command name (which may hold spaces and parentheses:
    the last `)` ends it): field 3 of proc(5) first. None when the process is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            text = f.read().decode("ascii", "replace")
    except OSError:
        return None
    return text[text.rfind(")") + 2:].split()


def _task_files(pid: int, name: str) -> Iterator[tuple[int, str]]:
    """(thread id, text) of /proc/PID/task/TID/`name` for each thread of `pid` still there."""
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return
    for tid in tasks:
        try:
            with open(f"/proc/{pid}/task/{tid}/{name}", "rb") as f:
                yield int(tid), f.read().decode("ascii", "replace")
        except OSError:
            continue


def running_threads(pids: set[int]) -> set[int]:
    """The threads of `pids` that are neither stopped nor gone (state of proc(5) field 3 not
    `T`, `t`, `Z` or `X`), by thread id."""
    return {tid for pid in pids for tid, text in _task_files(pid, "stat")
            if text[text.rfind(")") + 2:][:1] not in ("T", "t", "Z", "X", "")}


def wait_stopped(pids: set[int], limit_s: float) -> set[int]:
    """Wait until every thread of `pids` has stopped (a SIGSTOP is sent, not yet taken: a thread
    running on another core goes on for a moment, one inside a system call until it returns),
    at most `limit_s`; the threads still running then."""
    deadline = time.monotonic() + limit_s
    while True:
        left = running_threads(pids)
        if not left or time.monotonic() >= deadline:
            return left
        time.sleep(0.0001)


def _cpu_s(pid: int) -> float | None:
    fields = stat_fields(pid)
    if fields is None:
        return None
    try:
        return (int(fields[11]) + int(fields[12])) / _TICKS  # utime, stime
    except (IndexError, ValueError):
        return None


def _cpus_allowed(pid: int, tid: str) -> int | None:
    try:
        with open(f"/proc/{pid}/task/{tid}/status") as f:
            for line in f:
                if line.startswith("Cpus_allowed_list:"):
                    return _count(line.split(":", 1)[1].strip())
    except OSError:
        pass
    return None


def _count(cpu_list: str) -> int:
    n = 0
    for part in filter(None, cpu_list.split(",")):
        lo, _, hi = part.partition("-")
        n += int(hi or lo) - int(lo) + 1
    return n


class Sampler:
    """Samples `pid` on a thread of its own until `stop` (use `start` to make one)."""

    def __init__(self, pid: int, interval_s: float) -> None:
        self.pid, self.interval_s = pid, interval_s
        self._stop = threading.Event()
        self._max_threads, self._max_cpus, self._samples = 0, None, 0
        self._t0 = time.monotonic()
        self._cpu0 = _cpu_s(pid)
        self._thread = threading.Thread(target=self._run, name=f"procwatch-{pid}", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            self._sample()
            self._stop.wait(self.interval_s)

    def _sample(self) -> None:
        try:
            tids = os.listdir(f"/proc/{self.pid}/task")
        except OSError:
            return
        self._samples += 1
        self._max_threads = max(self._max_threads, len(tids))
        if self._samples % _AFFINITY_EVERY != 1:
            return
        # Affinity is per thread: the widest one counts (a candidate may widen one thread).
        for tid in tids:
            cpus = _cpus_allowed(self.pid, tid)
            if cpus is not None and (self._max_cpus is None or cpus > self._max_cpus):
                self._max_cpus = cpus

    def stop(self) -> ProcSample:
        """Stop sampling; what was seen since `start`."""
        self._stop.set()
        self._thread.join()
        self._sample()
        cpu1 = _cpu_s(self.pid)
        cpu = None if self._cpu0 is None or cpu1 is None else round(cpu1 - self._cpu0, 3)
        return ProcSample(max_threads=self._max_threads, cpu_s=cpu,
                          wall_s=round(time.monotonic() - self._t0, 3),
                          max_cpus=self._max_cpus, samples=self._samples)


def start(pid: int, interval_s: float = 0.001) -> Sampler:
    """Start sampling the child `pid` (see module doc); `stop()` returns a `ProcSample`."""
    return Sampler(pid, interval_s)


def descendants(root: int) -> set[int]:
    """Every live process whose chain of parents leads to `root` (not `root` itself), read from
    the kernel's lists of each thread's children (/proc/PID/task/TID/children). A process that
    left by a double fork has another parent (the harness, a subreaper) and is not among them."""
    found: set[int] = set()
    frontier = [root]
    while frontier:
        pid = frontier.pop()
        for _tid, text in _task_files(pid, "children"):
            try:
                kids = [int(x) for x in text.split()]
            except ValueError:
                continue
            for kid in kids:
                if kid not in found:
                    found.add(kid)
                    frontier.append(kid)
    return found
