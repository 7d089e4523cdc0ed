"""Does another process creating a CUDA context move the timings of a process being timed?
(GPU machine.) It decides whether a child may create its context before the device lock
(`EvalConfig.cuda_init`): that is safe only if the answer is no.

    python bench/init_interference.py [--seconds 8] [--rounds 3]

A timed process runs two kernels back to back, each call timed with CUDA events and with the
host clock around a synchronize: a ~1 ms matmul and a ~20 us elementwise kernel. Phases
alternate: quiet, then stressed by one of
  ctx    a process that creates and destroys the primary context as fast as the driver lets it
         (libcuda through ctypes: retain, make current, allocate 2 MiB, free, release, reset),
  fork   four processes that have imported torch without touching CUDA (as kloop's template
         process) fork children that do what a kloop child does before the lock (create the
         context through torch) and exit, over and over,
and the medians and p90s of each phase are printed with stressed/quiet ratios (quiet = the mean
of the quiet phases around it). No targets; it prints numbers.
"""

from __future__ import annotations

import argparse
import ctypes
import multiprocessing as mp
import os
import statistics
import sys
import time


def ctx_stress(stop: mp.Event, counter: mp.Value) -> None:
    cuda = ctypes.CDLL("libcuda.so.1")
    assert cuda.cuInit(0) == 0
    dev, ctx, ptr = ctypes.c_int(), ctypes.c_void_p(), ctypes.c_uint64()
    assert cuda.cuDeviceGet(ctypes.byref(dev), 0) == 0
    while not stop.is_set():
        assert cuda.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev) == 0
        cuda.cuCtxSetCurrent(ctx)
        if cuda.cuMemAlloc_v2(ctypes.byref(ptr), 2 << 20) == 0:
            cuda.cuMemFree_v2(ptr)
        cuda.cuDevicePrimaryCtxRelease_v2(dev)
        cuda.cuDevicePrimaryCtxReset_v2(dev)
        with counter.get_lock():
            counter.value += 1


def fork_stress(stop: mp.Event, counter: mp.Value) -> None:
    import torch  # noqa: F401  (imported once, CUDA untouched, as in kloop's template)

    while not stop.is_set():
        pid = os.fork()
        if pid == 0:
            import torch

            torch.cuda.synchronize()
            os._exit(0 if torch.cuda.is_initialized() else 1)
        _, status = os.waitpid(pid, 0)
        if status == 0:
            with counter.get_lock():
                counter.value += 1


def timed_phase(seconds: float) -> dict[str, list[float]]:
    import torch

    a = torch.randn(4096, 4096, device="cuda")
    x = torch.randn(1 << 20, device="cuda")
    out: dict[str, list[float]] = {"mm_event": [], "mm_wall": [], "add_event": [], "add_wall": []}
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    stop_at = time.monotonic() + seconds
    while time.monotonic() < stop_at:
        for name, fn in (("mm", lambda: a @ a), ("add", lambda: x + 1.0)):
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            start.record()
            fn()
            end.record()
            torch.cuda.synchronize()
            out[f"{name}_wall"].append((time.perf_counter() - t0) * 1e3)
            out[f"{name}_event"].append(start.elapsed_time(end))
    return out


def _q(v: list[float], q: float) -> float:
    v = sorted(v)
    return v[min(len(v) - 1, int(q * len(v)))]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=8.0)
    ap.add_argument("--rounds", type=int, default=2)
    args = ap.parse_args()
    import torch

    torch.backends.cuda.matmul.allow_tf32 = False
    timed_phase(1.0)  # warm-up: cuBLAS, clocks
    ctx = mp.get_context("spawn")
    phases: list[tuple[str, dict[str, list[float]], int]] = []
    for _ in range(args.rounds):
        for kind, target, workers in (("ctx", ctx_stress, 1), ("fork", fork_stress, 4)):
            phases.append(("quiet", timed_phase(args.seconds), 0))
            stop, counter = ctx.Event(), ctx.Value("i", 0)
            procs = [ctx.Process(target=target, args=(stop, counter)) for _ in range(workers)]
            for p in procs:
                p.start()
            time.sleep(1.0)  # the stress is running before the clock starts
            phases.append((kind, timed_phase(args.seconds), 0))
            stop.set()
            for p in procs:
                p.join(timeout=60)
            phases[-1] = (kind, phases[-1][1], counter.value)
    phases.append(("quiet", timed_phase(args.seconds), 0))
    keys = ["mm_event", "mm_wall", "add_event", "add_wall"]
    print(f"{'phase':7} {'contexts':>8} " + " ".join(f"{k + ' p50':>14} {'p90':>8}" for k in keys))
    for kind, data, n in phases:
        print(f"{kind:7} {n:8d} " + " ".join(
            f"{statistics.median(data[k]):14.4f} {_q(data[k], 0.9):8.4f}" for k in keys))
    print("\nstressed / quiet (quiet: the mean of the quiet phases before and after)")
    for i, (kind, data, n) in enumerate(phases):
        if kind == "quiet":
            continue
        before, after = phases[i - 1][1], phases[i + 1][1]
        cells = []
        for k in keys:
            quiet50 = (statistics.median(before[k]) + statistics.median(after[k])) / 2
            quiet90 = (_q(before[k], 0.9) + _q(after[k], 0.9)) / 2
            cells.append(f"{k} p50 {statistics.median(data[k]) / quiet50:.4f} "
                         f"p90 {_q(data[k], 0.9) / quiet90:.4f}")
        print(f"{kind:6} ({n} contexts): " + "; ".join(cells))
    return 0


if __name__ == "__main__":
    sys.exit(main())
