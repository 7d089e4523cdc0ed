"""The trusted clock: the harness times every served call itself and copies its output out.

A call, as the harness sees it: `prep` (the worker flushes the L2 and synchronises; off the
clock), then start the clock, send `call seed` (the seed is fresh and secret: the worker can only
make the call's inputs after the clock started), wait for the reply, copy the output out of the
shared memory, stop the clock. Nothing the worker process does can move either end of that
interval: the clock is `time.perf_counter` in this process, and the output that is judged is the
copy taken before the clock stopped. The reply itself proves nothing; a reply that arrives before
its request was sent (written ahead into the pipe) is a protocol violation.

The handshake (two pipe wake-ups, drawing the inputs, copying the output, synchronising) is
measured with `null` calls in the trusted reference worker and reported with every timing; the
numbers of record are net of it.
"""

from __future__ import annotations

import fcntl
import math
import os
import select
import time
from dataclasses import dataclass, field

from evaluator.worker.serve import (
    OP_CALL,
    OP_NULL,
    OP_PREP,
    OP_STOP,
    REPLY,
    REQUEST,
    SPIN_S,
    ServeLayout,
    read_exact,
)

_perf_counter = time.perf_counter
_SEALS = getattr(fcntl, "F_SEAL_SHRINK", 0x0002) | getattr(fcntl, "F_SEAL_GROW", 0x0004) | \
    getattr(fcntl, "F_SEAL_SEAL", 0x0001)
_F_ADD_SEALS = getattr(fcntl, "F_ADD_SEALS", 1033)


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
    """Trusted: from sending the request to holding the output's copy."""
    event_ms: float | None
    """The worker's own CUDA-event time of the forward (its word only; a cross-check)."""
    data: bytes | None


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
    _closed: bool = field(default=False, repr=False)

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

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        for fd in (self.req_r, self.req_w, self.rep_r, self.rep_w, self.mem):
            if fd >= 0:
                try:
                    os.close(fd)
                except OSError:
                    pass

    # ---- one request --------------------------------------------------------------------

    def _send(self, op: int, seed: int) -> None:
        if select.select([self.rep_r], [], [], 0)[0]:
            raise ChannelBroken("protocol", "the worker wrote a reply before it was asked")
        try:
            os.write(self.req_w, REQUEST.pack(op, seed))
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

    def _output(self) -> bytes | None:
        assert self.layout is not None
        data = os.pread(self.mem, self.layout.total, 0)
        return data if len(data) == self.layout.total else None

    def prep(self, deadline: float) -> None:
        self._send(OP_PREP, 0)
        self._wait(deadline)

    def call(self, seed: int, deadline: float, null: bool = False) -> CallResult:
        """One timed call (after `prep`): the clock runs from the request to the output copy."""
        op = OP_NULL if null else OP_CALL
        t0 = _perf_counter()
        self._send(op, seed)
        status, ms = self._wait(deadline)
        data = self._output()
        t1 = _perf_counter()
        event = None if math.isnan(ms) or ms < 0 else float(ms)
        return CallResult(status=status, wall_ms=(t1 - t0) * 1000.0, event_ms=event, data=data)

    def stop(self) -> None:
        """Tell the worker to stop serving, and close our end: a reader that never got the
        stop (a thread of the candidate's took it) sees the end of the pipe instead."""
        try:
            os.write(self.req_w, REQUEST.pack(OP_STOP, 0))
        except OSError:
            pass
        try:
            os.close(self.req_w)
        except OSError:
            pass
        self.req_w = -1
