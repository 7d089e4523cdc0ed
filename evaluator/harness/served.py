"""Driving a worker's served calls: the null calls (handshake), the warm-up and the timed,
checked calls, all through `harness.clock.CallChannel`.

The warm-up calls draw fresh seeds no one checks (they are neither timed nor judged: cheating on
them gains nothing); every timed call's output is handed to `on_output`, which compares it with
the reference's output for the same seed off the clock.
"""

from __future__ import annotations

import contextlib
import gc
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from kloop.evaluator.common.result import BoundedEvents, GpuSample, TimingStats
from kloop.evaluator.common.wire import OK
from kloop.evaluator.harness import cores, gpustate
from kloop.evaluator.harness.clock import CallChannel, CallResult, ChannelBroken
from kloop.evaluator.harness.cputhreads import one_cpu_thread
from kloop.evaluator.harness.flusher import flusher

_MAX_WARMUP_CALLS = 1000


@dataclass(frozen=True)
class CallPlan:
    seeds: list[int]
    """The timed calls, each on its own fresh seed; their outputs are checked."""
    warmup_calls: int
    warmup_ms: float
    null_calls: int = 0
    """Handshake calls first (`null_call_count`)."""
    prep: bool = True
    """Flush the L2 before each call (GPU)."""
    flusher: str | None = None
    """Also flush it from the trusted flusher for this device (`evaluator.harness.flusher`)."""
    gpu: str | None = None
    """Read the GPU's clocks and temperature (NVML) around the timed calls: the device as
    `CUDA_VISIBLE_DEVICES` names it (`evaluator.harness.gpustate`)."""
    role: int = 0
    """Which of a parked reference worker's models serves the calls (`protocol.ROLES`)."""


HANDSHAKE_JITTER_MS = 0.5
"""How far below its real work a call's record may read: the fastest null call bounds what
serving a call costs only to within the serving path's jitter (µs on an idle host; a loaded
2-core CI host read a 20 ms call as 19.994 ms). Tests that check the record against known work
allow this much; a forged clock is off by far more."""


def null_call_count(on_cpu: bool, calls: int) -> int:
    """How many null calls open a served session (their fastest is the handshake)."""
    return 3 if on_cpu else max(10, calls // 4)


@dataclass
class Served:
    wall_ms: list[float] = field(default_factory=list)
    event_ms: list[float | None] = field(default_factory=list)
    null_ms: list[float] = field(default_factory=list)
    warmup_done: int = 0
    gpu_before: GpuSample | None = None
    gpu_after: GpuSample | None = None

    def handshake_ms(self) -> float | None:
        """The fastest null call: a lower bound of what serving a call costs."""
        return float(np.min(self.null_ms)) if self.null_ms else None

    def null_median_ms(self) -> float | None:
        return float(np.median(self.null_ms)) if self.null_ms else None


OnOutput = Callable[[int, CallResult], bool]
"""Told each timed call's result (off the clock); returns False to stop calling."""


def run_plan(ch: CallChannel, plan: CallPlan, budget_s: float, on_output: OnOutput,
             timed: bool = True) -> Served:
    """Run the plan; raises `ChannelBroken` (timeout, protocol, closed). `on_output` runs on one
    CPU thread, whoever calls (`evaluator.harness.cputhreads`). `timed`: on the timer core;
    calls made for their outputs only (a shared hold's) stay off it, where several run at once."""
    with one_cpu_thread(), cores.timing_thread() if timed else contextlib.nullcontext():
        return _run_plan(ch, plan, budget_s, on_output)


def _run_plan(ch: CallChannel, plan: CallPlan, budget_s: float, on_output: OnOutput) -> Served:
    deadline = time.monotonic() + budget_s
    out = Served()

    flush = flusher(plan.flusher).flush if plan.flusher is not None else None

    def one(seed: int, null: bool = False) -> CallResult:
        if plan.prep:
            ch.prep(deadline, light=null)
        if flush is not None:
            flush()  # after the worker's prep: nothing of the worker's runs between it and the call
        return ch.call(seed, deadline, null=null, role=plan.role)

    _warm_up(plan, one, out)
    # No collector pause inside a clock: collect once here, then keep it off while timing.
    gc.collect()
    was_on = gc.isenabled()
    gc.disable()
    try:
        # After the warm-up: the first calls of a process pay for allocations and lazy set-up.
        for _ in range(plan.null_calls):
            r = one(secrets.randbits(62), null=True)
            if r.status != OK:
                raise ChannelBroken("protocol", "a null call failed")
            out.null_ms.append(r.wall_ms)
        if plan.gpu is not None:
            out.gpu_before = gpustate.sample(plan.gpu)
        for i, seed in enumerate(plan.seeds):
            r = one(seed)
            out.wall_ms.append(r.wall_ms)
            out.event_ms.append(r.event_ms)
            if not on_output(i, r) or r.status != OK:
                break
    finally:
        if was_on:
            gc.enable()
    if plan.gpu is not None and out.gpu_before is not None:
        out.gpu_after = gpustate.sample(plan.gpu)
    return out


def _warm_up(plan: CallPlan, one: Callable[..., CallResult], out: Served) -> None:
    def call() -> None:
        r = one(secrets.randbits(62))
        out.warmup_done += 1
        if r.status != OK:  # the failure repeats on a timed call, where it is judged
            raise _WarmupFailed

    try:
        for _ in range(plan.warmup_calls):
            call()
        # The time budget starts after the first calls, which may include compilation.
        end = time.monotonic() + plan.warmup_ms / 1000.0
        while time.monotonic() < end and out.warmup_done < _MAX_WARMUP_CALLS:
            call()
    except _WarmupFailed:
        return


class _WarmupFailed(Exception):
    pass


def overhead_ms(served: Served) -> float | None:
    """What the harness's clock adds to a call, as the trusted reference worker's own calls show
    it: the median wall time minus the median of its CUDA events around the same forwards. It
    covers the pipes, the input draw, the output copy and every wake-up, as they are for this
    problem's sizes and for a call that does GPU work. Taking it off a candidate's calls assumes
    the candidate serves as slowly as the reference worker does, which a candidate whose native
    code trims its own serving path need not: so it gives a best estimate
    (`TimingStats.calibrated_median_ms`), never the number of record. None without events."""
    events = [e for e in served.event_ms if e is not None]
    if not events or not served.wall_ms:
        return None
    return max(float(np.median(served.wall_ms)) - float(np.median(events)), 0.0)


def event_bound_ms(served: Served, handshake_ms: float | None) -> float | None:
    """The most serving overhead one call may hide from events: the 90th percentile of wall
    minus events over the trusted reference worker's own calls, never below the handshake.
    The 90th, not the largest: one slow wake-up would otherwise widen every candidate's room
    to forge; an honest candidate's slower calls are only moved up (never flattered)."""
    gaps = [w - e for w, e in zip(served.wall_ms, served.event_ms, strict=True) if e is not None]
    if not gaps:
        return None
    return max(float(np.percentile(gaps, 90)), handshake_ms or 0.0, 0.0)


def bounded_events(served: Served, handshake_ms: float | None,
                   bound_ms: float | None) -> BoundedEvents | None:
    """Each call's event time kept within [wall - bound, wall - handshake]; None unless every
    timed call has one (a worker that withholds some gets the trusted clock's numbers)."""
    if bound_ms is None or not served.wall_ms or any(e is None for e in served.event_ms):
        return None
    wall = np.asarray(served.wall_ms, dtype=np.float64)
    ev = np.asarray(served.event_ms, dtype=np.float64)
    lo = np.maximum(wall - bound_ms, 0.0)
    hi = np.maximum(wall - (handshake_ms or 0.0), lo)
    kept = np.clip(ev, lo, hi)
    return BoundedEvents(
        median_ms=float(np.median(kept)), mean_ms=float(kept.mean()), std_ms=float(kept.std()),
        min_ms=float(kept.min()), max_ms=float(kept.max()), bound_ms=bound_ms,
        raised=int((ev < lo).sum()), lowered=int((ev > hi).sum()))


def timing_stats(served: Served, handshake_ms: float | None, *, on_cuda: bool,
                 null_call_ms: float | None = None,
                 calibrated_overhead_ms: float | None = None,
                 event_bound: float | None = None) -> TimingStats | None:
    """The trusted numbers of record: wall time per call net of `handshake_ms`, the fastest
    null call (what no candidate can serve a call below; never below 0), with the raw median,
    the null calls' median, the calibrated estimate, the worker's own event median and its
    events bounded by `event_bound` (`bounded_events`) kept beside them."""
    if not served.wall_ms:
        return None
    raw = np.asarray(served.wall_ms, dtype=np.float64)
    hs = handshake_ms or 0.0
    net = np.maximum(raw - hs, 0.0)
    q1, q3 = np.percentile(net, [25, 75])
    events = [e for e in served.event_ms if e is not None]
    return TimingStats(
        median_ms=float(np.median(net)), mean_ms=float(net.mean()), std_ms=float(net.std()),
        min_ms=float(net.min()), max_ms=float(net.max()), iqr_ms=float(q3 - q1),
        n_trials=len(net), clock="harness", comparable=on_cuda,
        raw_median_ms=float(np.median(raw)), handshake_ms=handshake_ms,
        null_call_ms=null_call_ms,
        calibrated_median_ms=None if calibrated_overhead_ms is None
        else max(float(np.median(raw)) - calibrated_overhead_ms, 0.0),
        worker_event_median_ms=float(np.median(events)) if events else None,
        events=bounded_events(served, handshake_ms, event_bound) if on_cuda else None,
        gpu_before=served.gpu_before, gpu_after=served.gpu_after,
    )
