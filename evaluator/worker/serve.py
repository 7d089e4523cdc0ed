"""The one kind of call: a worker serves forward calls to the harness, which holds the clock.

Every call the harness times is also a call whose output it checks, and every call looks the
same from inside the worker: a request carries a fresh secret seed; the worker draws the
problem's inputs from `get_inputs()` under that seed *on the device* (so nothing about the
inputs is known before the harness starts its clock), calls the model once under `no_grad`,
copies the outputs into memory shared with the harness on the current stream, synchronises the
device and answers. The harness stops its clock only after it has copied the output out of the
shared memory, so work the model left running (a side stream it never joined, a launch it
deferred) is either inside the measured time or missing from the output it checks.

Requests (harness -> worker) and replies (worker -> harness) are fixed 16-byte records on two
pipes; outputs go to a sealed memfd the harness created (its size cannot change). `prep` (flush
the L2, synchronise) is sent before each timed call, off the clock; `null` is the same call
with the model replaced by copying zeros of the output's shape (the handshake's own cost,
measured only in the trusted reference worker). A request names a `role`: the reference worker
serves its eager model and its compiled baselines on one channel, chosen call by call, so that
the harness can interleave them with the candidate's calls under the same conditions
(`evaluator.harness.paired`); a candidate serves role 0 only.

On a GPU the handshake is kept small and steady, so that what is left after taking it off is
the forward: the shared memory is page-locked (the output copies are DMA at full bandwidth, not
staged through a bounce buffer), and the worker spins (briefly) on the request pipe and on an
event after the copies instead of sleeping in a blocking wait, whose wake-up costs a variable
0.1-0.5 ms on a virtual machine.
"""

from __future__ import annotations

import ctypes
import gc
import math
import mmap
import os
import time
from collections.abc import Callable
from typing import Any

import torch

from kloop.evaluator.common.wire import (
    BAD_OUTPUT,
    DTYPES,
    NOT_QUIET,
    OK,
    OP_NULL,
    OP_PREP,
    OP_QUIET,
    OP_REST,
    OP_STOP,
    PREP_LIGHT,
    RAISED,
    REPLY,
    REQUEST,
    SPIN_S,
    ServeLayout,
    read_exact,
)

_MIN_FLUSH_BYTES = 256 << 20
PREP_BUSY_CYCLES = 200_000
"""`prep` keeps the GPU busy for this many SM cycles (0.1 ms at an H100's or H200's boost
clock) before it flushes the L2, so that no timed call starts on an idle device. It was 2 M
cycles (1 ms) against a cold clock between calls (an idle H200 reads 345 MHz, GPU_VALIDATION.md
2026-12-01), but the busy phase changed nothing measurable (matmul events 0.38-0.42 ms with it
and without, the H200, 2026-12-01 at 9be831f), while `prep` became most of the rounds' own
work: 0.93-1.02 s of a small model's 1.1-1.6 s of rounds, against 0.22-0.56 s inside its calls
(L3/4 and the GPU tests' MLP, an H100, 2026-12-06, `stage_seconds.timing_prep`). The L2 flush
(256 MB zeroed) keeps the device busy too."""
QUIET_PROBE_CYCLES = 1_000
"""The quiet check's probe kernel (`Server.quiet`): a microsecond of device work."""
QUIET_MS = 0.25
"""A probe back within this is a quiet device. On an H100 (bench/diag_timeslice.py, 2026-12-06)
a probe alone came back in 0.010 ms (p50; 0.022 ms the slowest of 200), and while another
process's kernel ran, each probe waited out that context's time slice: 2.2-2.4 ms. A 1 ms kernel
of ours then took 3.4 ms of wall time while its CUDA events still read 1.01 ms: events do not
see the wait, so the check reads the wall."""
QUIET_LIMIT_S = 0.5
"""Longer than this busy with another process's work is not what a process stopped after its
calls left queued: the check gives up (`NOT_QUIET`)."""


class Server:
    """The worker's end of the call channel (fds inherited from the harness)."""

    def __init__(self, req_fd: int, rep_fd: int, mem_fd: int, layout: ServeLayout, device: str):
        for fd in (req_fd, rep_fd, mem_fd):
            os.set_inheritable(fd, False)  # compilers and helpers the worker starts get none
        os.set_blocking(req_fd, False)  # read_exact spins, then waits in select
        self.req_fd, self.rep_fd, self.device = req_fd, rep_fd, device
        self.mem = mmap.mmap(mem_fd, layout.total)
        base = ctypes.addressof(ctypes.c_char.from_buffer(self.mem))
        self.mem_range = (base, base + layout.total)
        on_cuda = device == "cuda"
        self.spin_s = SPIN_S if on_cuda else 0.0
        self.pinned = on_cuda and _pin(self.mem, layout.total)
        flat = torch.frombuffer(self.mem, dtype=torch.uint8)
        self.views = [flat[s.offset:s.offset + s.nbytes].view(DTYPES[s.dtype]).view(s.shape)
                      for s in layout.slots]
        self.zeros = [torch.zeros(v.shape, dtype=v.dtype, device=device) for v in self.views]
        self.flush = _flush_buffer() if on_cuda else None
        self.busy_cycles = PREP_BUSY_CYCLES
        self.events = (torch.cuda.Event(enable_timing=True),
                       torch.cuda.Event(enable_timing=True)) if on_cuda else None
        self.copied = torch.cuda.Event() if on_cuda else None

    def reply(self, status: int, event_ms: float = math.nan) -> None:
        os.write(self.rep_fd, REPLY.pack(status, event_ms))

    def serve(self, model: Callable[..., Any] | dict[int, Callable[..., Any]],
              draw: Callable[[int], list[Any]],
              on_problem: Callable[[str, BaseException | None], None]) -> None:
        """Answer requests until `stop`. `model`: the one served (role 0), or role -> model
        (the reference worker's baselines); `draw(seed)` makes a call's inputs; `on_problem` is
        told (before the reply) why a call's output could not be served or what it raised; a
        raise ends serving."""
        models = model if isinstance(model, dict) else {0: model}
        # The automatic collector stays off while serving (a pause inside a call is on the
        # harness's clock); `prep`, off the clock, collects the young generations instead.
        gc.collect()
        gc.disable()
        try:
            with torch.no_grad():
                self._loop(models, draw, on_problem)
        finally:
            gc.enable()

    def _loop(self, models, draw, on_problem) -> None:
        spin = self.spin_s
        while True:
            op, role, seed = REQUEST.unpack(read_exact(self.req_fd, REQUEST.size, spin))
            spin = self.spin_s
            if op == OP_STOP:
                return
            if op == OP_REST:
                # The harness turns to the other process of a paired round: wait for the next
                # request asleep, not spinning on a core the other process may want (the
                # `prep` that wakes it is off the clock). `_call` waited for its own work; what
                # was launched since (by another thread) is waited for too. What a thread of an
                # untrusted process launches after this answer is the harness's to keep out of
                # the next side's calls: it stops the process, and the trusted worker waits for
                # a quiet device (`quiet`; harness.paired, K14b/K14c).
                spin = 0.0
                self._sync()
                self.reply(OK)
                continue
            if op == OP_PREP:
                gc.collect(1)  # off the clock: the young cycles of the last call
                if self.flush is not None and seed != PREP_LIGHT:
                    torch.cuda._sleep(self.busy_cycles)
                    self.flush.zero_()
                self._sync()
                self.reply(OK)
                continue
            if op == OP_QUIET:  # asked of trusted workers only, before a baseline's call
                self._sync()
                waited = self.quiet() if self.device == "cuda" else 0.0
                self.reply(OK if waited is not None else NOT_QUIET,
                           waited if waited is not None else math.nan)
                continue
            try:
                if role not in models:
                    raise RuntimeError(f"a call for role {role}, which this worker does not serve")
                status, ms = self._call(op, seed, models[role], draw, on_problem)
            except BaseException as e:  # the model's fault: reported, serving ends
                on_problem("raised", e)
                self.reply(RAISED)
                return
            self.reply(status, ms)

    def drain(self) -> None:
        """After a raise ended `serve`: answer every request with RAISED until `stop`. The
        reference worker serves several roles on one channel, and the harness's plan for the
        failed one runs on to its stop."""
        while True:
            op, _, _ = REQUEST.unpack(read_exact(self.req_fd, REQUEST.size, self.spin_s))
            if op == OP_STOP:
                return
            self.reply(RAISED)

    def _call(self, op: int, seed: int, model, draw, on_problem) -> tuple[int, float]:
        inputs = draw(seed)
        if op == OP_NULL:
            self._copy_out(self.zeros)
            return OK, math.nan
        ev = self.events
        if ev is not None:
            ev[0].record()
        out = model(*inputs)
        if ev is not None:
            ev[1].record()
        outs = list(out) if isinstance(out, (tuple, list)) else [out]
        problem = self._check(outs)
        if problem is not None:
            self._sync()
            on_problem(problem, None)
            return BAD_OUTPUT, math.nan
        self._copy_out(outs)
        # Work the call left queued on a stream it never joined (on scratch memory: the output
        # is already copied) would otherwise run into the next side's call of a paired round,
        # slowing a baseline: it is waited for here, on the call's clock (exploit K14).
        self._sync()
        return OK, ev[0].elapsed_time(ev[1]) if ev is not None else math.nan

    def _copy_out(self, outs: list[torch.Tensor]) -> None:
        """Copy on the current stream (output a stream it never joined is still writing is
        copied as it is), then wait for the copies only."""
        for view, o in zip(self.views, outs, strict=True):
            view.copy_(o, non_blocking=self.pinned)
        if self.copied is None:
            return
        self.copied.record()
        until = time.monotonic() + self.spin_s
        while not self.copied.query():
            if time.monotonic() > until:
                self.copied.synchronize()
                break

    def _check(self, outs: list[Any]) -> str | None:
        if len(outs) != len(self.views):
            return f"returned {len(outs)} outputs, the reference returns {len(self.views)}"
        for i, (o, v) in enumerate(zip(outs, self.views, strict=True)):
            if type(o) is not torch.Tensor:
                return f"output {i} is a {type(o).__qualname__}, not a plain torch.Tensor"
            if list(o.shape) != list(v.shape) or o.dtype != v.dtype:
                return (f"output {i} is {o.dtype} {list(o.shape)}, the reference's is "
                        f"{v.dtype} {list(v.shape)}")
            if self._aliases(o):
                return (f"output {i} is the shared output memory itself: every call copies "
                        f"its output there, and that copy cannot be skipped")
        return None

    def _aliases(self, o: torch.Tensor) -> bool:
        """Whether `o`'s storage overlaps the shared output memory (a candidate that found the
        server's own view could otherwise make `copy_` a no-op, while the subtracted null call
        still pays for the copy)."""
        if o.device.type != "cpu":
            return False
        storage = o.untyped_storage()
        lo, hi = self.mem_range
        start = storage.data_ptr()
        return start < hi and start + storage.nbytes() > lo

    def _sync(self) -> None:
        if self.device == "cuda":
            torch.cuda.synchronize()

    def quiet(self) -> float | None:
        """Wait until no other process has work on the device: the milliseconds waited (0.0
        when it was quiet at once), None when it never was within `QUIET_LIMIT_S`.

        Contexts of different processes share the GPU by time slices: while another context
        has work queued, a launch of ours waits for that context's slice to end, and it gets a
        fresh slice each time ours goes idle. So a probe of a few cycles launched right after
        our own work finished comes back in microseconds on a quiet device and only after a
        slice when another process's kernel is resident. Probed again until it comes back
        fast, the other work drains first (a candidate's process is stopped while baselines
        are timed, so what it left is finite): exploit K14b."""
        start = time.perf_counter()
        waited = 0.0
        while True:
            t0 = time.perf_counter()
            torch.cuda._sleep(QUIET_PROBE_CYCLES)
            torch.cuda.synchronize()
            ms = (time.perf_counter() - t0) * 1000.0
            if ms < QUIET_MS:
                return waited
            waited = (time.perf_counter() - start) * 1000.0
            if waited > QUIET_LIMIT_S * 1000.0:
                return None


def _pin(mem: mmap.mmap, size: int) -> bool:
    """Page-lock the shared memory for DMA (cudaHostRegister); False if the driver refuses."""
    try:
        ptr = ctypes.addressof(ctypes.c_char.from_buffer(mem))
        return int(torch.cuda.cudart().cudaHostRegister(ptr, size, 0)) == 0
    except Exception:
        return False


def _flush_buffer() -> torch.Tensor:
    props = torch.cuda.get_device_properties(torch.cuda.current_device())
    l2 = int(getattr(props, "L2_cache_size", 0) or 0)
    return torch.empty(max(_MIN_FLUSH_BYTES, 4 * l2) // 4, dtype=torch.int32, device="cuda")
