"""THE timing function: the candidate and both baselines are timed by `time_callable` only.

On CUDA each trial is: L2 flush (a write larger than the L2), device-wide synchronize, start
event, call, end event, device-wide synchronize. Inputs rotate round-robin over several cloned
sets so an output cached from the previous call cannot be returned. Everything runs under
`torch.no_grad()`. On CPU a host clock is used and the numbers are marked not comparable.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch

from evaluator.result import TimingStats

_MIN_FLUSH_BYTES = 256 << 20
_MAX_WARMUP_CALLS = 1000
# Bound now, before any candidate code is imported into this process: a candidate that later
# replaces `torch.cuda.synchronize` or `time.perf_counter` does not change what we call.
_cuda_sync = torch.cuda.synchronize
_cuda_event = torch.cuda.Event
_perf_counter = time.perf_counter


def time_callable(
    fn: Callable[..., Any],
    input_sets: Sequence[Sequence[Any]],
    *,
    device: str,
    trials: int,
    warmup_calls: int,
    warmup_ms: float,
    l2_flush: bool = True,
) -> TimingStats:
    """Time `fn(*inputs)` over `trials` calls, rotating through `input_sets`.

    Args:
        fn: the model (or any callable) to time.
        input_sets: one or more argument lists; trial i uses `input_sets[i % len]`.
        device: `cuda` (CUDA events, L2 flush) or `cpu` (host clock).
        trials: timed calls (at least 1).
        warmup_calls: untimed calls first; then more calls until `warmup_ms` has passed.
        warmup_ms: minimum host time spent warming up after the warm-up calls.
        l2_flush: write a buffer larger than the L2 before every CUDA trial.
    """
    if trials < 1 or not input_sets:
        raise ValueError("time_callable needs trials >= 1 and at least one input set")
    on_cuda = device.startswith("cuda")
    with torch.no_grad():
        _warm_up(fn, input_sets, on_cuda, warmup_calls, warmup_ms)
        if on_cuda:
            times = _cuda_trials(fn, input_sets, trials, l2_flush)
        else:
            times = _host_trials(fn, input_sets, trials)
    return summarize(times, clock="cuda_event" if on_cuda else "host", comparable=on_cuda)


def summarize(times_ms: Sequence[float], *, clock: str, comparable: bool) -> TimingStats:
    a = np.asarray(times_ms, dtype=np.float64)
    q1, q3 = np.percentile(a, [25, 75])
    return TimingStats(
        median_ms=float(np.median(a)), mean_ms=float(a.mean()), std_ms=float(a.std()),
        min_ms=float(a.min()), max_ms=float(a.max()), iqr_ms=float(q3 - q1), n_trials=len(a),
        clock=clock, comparable=comparable,
    )


def _sync(on_cuda: bool) -> None:
    if on_cuda:
        _cuda_sync()


def _warm_up(fn, input_sets, on_cuda: bool, calls: int, ms: float) -> None:
    n = len(input_sets)
    for i in range(calls):
        fn(*input_sets[i % n])
        _sync(on_cuda)
    # The time budget starts after the first calls, which may include compilation.
    end = _perf_counter() + ms / 1000.0
    i = calls
    while _perf_counter() < end and i < _MAX_WARMUP_CALLS:
        fn(*input_sets[i % n])
        _sync(on_cuda)
        i += 1


def _flush_buffer() -> torch.Tensor:
    props = torch.cuda.get_device_properties(torch.cuda.current_device())
    l2 = int(getattr(props, "L2_cache_size", 0) or 0)
    size = max(_MIN_FLUSH_BYTES, 4 * l2)
    return torch.empty(size // 4, dtype=torch.int32, device="cuda")


def _cuda_trials(fn, input_sets, trials: int, l2_flush: bool) -> list[float]:
    flush = _flush_buffer() if l2_flush else None
    start, end = _cuda_event(enable_timing=True), _cuda_event(enable_timing=True)
    n = len(input_sets)
    times = []
    for i in range(trials):
        args = input_sets[i % n]
        if flush is not None:
            flush.zero_()
        _cuda_sync()
        start.record()
        fn(*args)
        end.record()
        _cuda_sync()
        times.append(start.elapsed_time(end))
    return times


def _host_trials(fn, input_sets, trials: int) -> list[float]:
    n = len(input_sets)
    times = []
    for i in range(trials):
        args = input_sets[i % n]
        t0 = _perf_counter()
        fn(*args)
        times.append((_perf_counter() - t0) * 1000.0)
    return times
