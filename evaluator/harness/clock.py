"""The trusted clock: the harness times every served call itself and copies its output out.

A call, as the harness sees it: `prep` (the worker flushes the L2 and synchronises; off the
clock), then start the clock, send `call seed` (the seed is fresh and secret: the worker can only
make the call's inputs after the clock started), wait for the reply, take a snapshot of the
output in the shared memory, stop the clock. Nothing the worker process does can move either end
of that interval: the clock is `time.perf_counter` in this process. The reply itself proves
nothing; a reply that arrives before its request was sent (written ahead into the pipe) is a
protocol violation.

The snapshot inside the clock is the whole output when it is small, and otherwise 512 random
64-byte lines of it, chosen in this process before the request (so the worker cannot know them);
the whole output is copied right after the clock stops (into memory the channel keeps,
`evaluator.harness.output`) and must hold the same bytes at those lines; the checks read only
that copy. A worker that answers before its output is complete (and finishes writing it off the
clock) leaves some lines unwritten at the snapshot: with a fraction f of the output late, a call
escapes with probability (1-f)^512, and every timed call is checked (f = 1 % escapes one call in
170, a hundred calls never). A late write is a protocol violation. This keeps the clock's own
cost independent of the output's size (copying 8 MB out inside the clock cost ~1 ms with a
variance larger than the 3 % the clock is held to).

The handshake (two pipe wake-ups, drawing the inputs, copying the output, synchronising) is
measured with `null` calls in the trusted reference worker and reported with every timing; the
numbers of record are net of it.
"""

from __future__ import annotations

import fcntl
import math
import mmap
import os
import secrets
import select
import time
from dataclasses import dataclass, field

import numpy as np

from kloop.evaluator.common.wire import (
    NOT_QUIET,
    OK,
    OP_CALL,
    OP_NULL,
    OP_PREP,
    OP_QUIET,
    OP_REST,
    OP_STOP,
    PREP_LIGHT,
    REPLY,
    REQUEST,
    SPIN_S,
    ServeLayout,
    read_exact,
)
from kloop.evaluator.harness.output import LINE, Output, copy_whole

_perf_counter = time.perf_counter
_SEALS = getattr(fcntl, "F_SEAL_SHRINK", 0x0002) | getattr(fcntl, "F_SEAL_GROW", 0x0004) | \
    getattr(fcntl, "F_SEAL_SEAL", 0x0001)
_F_ADD_SEALS = getattr(fcntl, "F_ADD_SEALS", 1033)
SAMPLE_LINES = 512
FULL_SNAPSHOT_BYTES = 256 << 10
"""Outputs up to this size are copied whole inside the clock (a few microseconds)."""


class ChannelBroken(Exception):
    """The worker broke the call protocol (a reply ahead of its request, a short reply, a
    closed pipe) or ran out of time: `kind` is `protocol`, `closed` or `timeout`."""

    def __init__(self, kind: str, message: str):
        super().__init__(message)
        self.kind = kind


@dataclass
class CallResult:
    status: int
    wall_ms: float
    """Trusted: from sending the request to holding the output's snapshot."""
    event_ms: float | None
    """The worker's own CUDA-event time of the forward (its word only; a cross-check)."""
    output: Output | None
    """None: the shared memory was cut short (it is sealed, so never once sized), or a large
    output nobody asked to keep (`CallChannel.call(keep=False)`)."""


@dataclass
class CallChannel:
    """Two pipes and a memfd, made before the worker is spawned; `child_fds` go to it."""

    req_r: int = -1
    req_w: int = -1
    rep_r: int = -1
    rep_w: int = -1
    mem: int = -1
    layout: ServeLayout | None = None
    spin: bool = False
    """Spin briefly on the reply instead of sleeping (GPU runs: a sleeping wait's wake-up would
    add a variable fraction of a millisecond to every call)."""
    full_snapshot_bytes: int = FULL_SNAPSHOT_BYTES
    _closed: bool = field(default=False, repr=False)
    _map: mmap.mmap | None = field(default=None, repr=False)
    _lines: np.ndarray | None = field(default=None, repr=False)
    _copy: np.ndarray | None = field(default=None, repr=False)
    _starts: np.ndarray | None = field(default=None, repr=False)
    _ends: np.ndarray | None = field(default=None, repr=False)
    _befores: np.ndarray | None = field(default=None, repr=False)
    _rng: np.random.Generator | None = field(default=None, repr=False)

    @classmethod
    def open(cls) -> CallChannel:
        ch = cls()
        ch.req_r, ch.req_w = os.pipe()
        ch.rep_r, ch.rep_w = os.pipe()
        os.set_blocking(ch.rep_r, False)  # read_exact spins, then waits in select
        ch.mem = os.memfd_create("kloop-outputs", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
        return ch

    def child_fds(self) -> tuple[int, int, int]:
        return self.req_r, self.rep_w, self.mem

    def spawned(self) -> None:
        """The child holds its ends now; ours would keep a dead child's pipe open."""
        for fd in (self.req_r, self.rep_w):
            os.close(fd)
        self.req_r = self.rep_w = -1

    def set_layout(self, layout: ServeLayout) -> None:
        """Size the shared memory once and seal it: a worker that could shrink it would make
        the harness read past its end."""
        if self.layout is not None:
            if layout != self.layout:
                raise ValueError("the call channel's layout is fixed once set")
            return
        os.ftruncate(self.mem, layout.total)
        fcntl.fcntl(self.mem, _F_ADD_SEALS, _SEALS)
        self.layout = layout
        self._map = mmap.mmap(self.mem, layout.total, prot=mmap.PROT_READ)
        self._lines = np.frombuffer(self._map, dtype=np.uint8).reshape(-1, LINE)
        counts = [-(-s.nbytes // LINE) for s in layout.slots]
        self._ends = np.cumsum(counts, dtype=np.int64)
        self._befores = self._ends - np.asarray(counts, dtype=np.int64)  # lines in earlier slots
        self._starts = np.asarray([s.offset // LINE for s in layout.slots], dtype=np.int64)
        self._rng = np.random.default_rng(secrets.randbits(128))

    def _pick(self) -> np.ndarray | None:
        """The lines this call's snapshot takes (None: the whole output), drawn in this process
        from a generator seeded with 128 secret bits."""
        assert self._ends is not None and self._starts is not None and self._rng is not None
        assert self._befores is not None
        n = int(self._ends[-1]) if len(self._ends) else 0
        if n * LINE <= self.full_snapshot_bytes:
            return None
        k = self._rng.integers(0, n, SAMPLE_LINES)
        slot = np.searchsorted(self._ends, k, side="right")
        return self._starts[slot] + (k - self._befores[slot])

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._lines = self._copy = None  # drop the view before the map it points into
        if self._map is not None:
            self._map.close()
        for fd in (self.req_r, self.req_w, self.rep_r, self.rep_w, self.mem):
            if fd >= 0:
                try:
                    os.close(fd)
                except OSError:
                    pass

    # ---- one request --------------------------------------------------------------------

    def _send(self, op: int, seed: int, role: int = 0) -> None:
        if select.select([self.rep_r], [], [], 0)[0]:
            raise ChannelBroken("protocol", "the worker wrote a reply before it was asked")
        try:
            os.write(self.req_w, REQUEST.pack(op, role, seed))
        except OSError as e:
            raise ChannelBroken("closed", f"the worker closed its call channel ({e})") from None

    def _wait(self, deadline: float) -> tuple[int, float]:
        try:
            data = read_exact(self.rep_r, REPLY.size, SPIN_S if self.spin else 0.0, deadline)
        except TimeoutError:
            raise ChannelBroken("timeout", "the call did not finish in time") from None
        except EOFError:
            raise ChannelBroken("closed", "the worker closed its call channel") from None
        status, ms = REPLY.unpack(data)
        return status, ms

    def _output(self) -> Output | None:
        """The whole output, copied (inside the clock: small outputs only)."""
        assert self.layout is not None
        data = os.pread(self.mem, self.layout.total, 0)
        if len(data) != self.layout.total:
            return None
        return Output(self.layout, np.frombuffer(data, dtype=np.uint8))

    def _after(self) -> Output:
        """The whole output, copied after the clock stopped into the buffer this channel
        keeps (large outputs: `evaluator.harness.output` says why whole, and why kept)."""
        assert self.layout is not None and self._lines is not None
        if self._copy is None:
            self._copy = np.empty(self.layout.total, dtype=np.uint8)
        copy_whole(self._copy, self._lines.reshape(-1))
        return Output(self.layout, self._copy)

    def prep(self, deadline: float, light: bool = False) -> None:
        """Off the clock, before a call: the worker collects, keeps the device busy a moment
        and flushes the L2 (`serve.Server`); `light` (before a null call): collects only."""
        self._send(OP_PREP, PREP_LIGHT if light else 0)
        self._wait(deadline)

    def quiet(self, deadline: float) -> float | None:
        """Off the clock, asked of a trusted worker before a baseline's call: wait until no
        other process's work is on the device (`serve.Server.quiet`); the milliseconds waited,
        None when the device never went quiet."""
        self._send(OP_QUIET, 0)
        status, ms = self._wait(deadline)
        if status == NOT_QUIET:
            return None
        return 0.0 if math.isnan(ms) else float(ms)

    def rest(self, deadline: float) -> None:
        """Off the clock: the worker waits for its next request asleep (`serve.OP_REST`)."""
        self._send(OP_REST, 0)
        self._wait(deadline)

    def call(self, seed: int, deadline: float, null: bool = False, role: int = 0,
             keep: bool = True) -> CallResult:
        """One timed call (after `prep`): the clock runs from the request to the snapshot.
        `role`: which of the worker's models serves it (the reference worker's baselines).
        `keep=False`: a call whose output nobody reads (a baseline's, a null call's) skips the
        whole copy of a large output after the clock (on the H100 at full size, L3/21's paired
        rounds took 15.4-16.8 s, 4.4 s of it inside calls, and every one of ~600 calls copied
        its 96 MB output, 2026-12-05); what the clock measures is the same, the sampled
        snapshot inside it included."""
        op = OP_NULL if null else OP_CALL
        pick = self._pick()
        assert self._lines is not None
        t0 = _perf_counter()
        self._send(op, seed, role)
        status, ms = self._wait(deadline)
        if pick is None:
            output = self._output()
        else:
            snap = self._lines[pick]  # fancy indexing copies
        t1 = _perf_counter()
        if pick is not None:
            output = self._after() if keep else None
            if output is not None and status == OK and \
                    not np.array_equal(output.lines(pick), snap):
                raise ChannelBroken("protocol", "the worker wrote its output after it answered "
                                    "(the output changed after the clock stopped)")
        event = None if math.isnan(ms) or ms < 0 else float(ms)
        return CallResult(status=status, wall_ms=(t1 - t0) * 1000.0, event_ms=event,
                          output=output)

    def stop(self, last: bool = True) -> None:
        """Tell the worker to stop serving. After its last serve, also close our end: a reader
        that never got the stop (a thread of the candidate's took it) sees the end of the pipe
        instead. The reference worker serves twice (eager, then compile) on one channel."""
        try:
            os.write(self.req_w, REQUEST.pack(OP_STOP, 0, 0))
        except OSError:
            pass
        if not last:
            return
        try:
            os.close(self.req_w)
        except OSError:
            pass
        self.req_w = -1
