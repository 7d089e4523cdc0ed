"""Does the harness's spinning OpenMP team slow the worker it times?

    python bench/diag_threads.py --cpu              # any host: the mechanism, no GPU
    python bench/diag_threads.py [--only L3/1-b8,L3/4] [--repeats 2]   # GPU machine

The same code (the reference as `ModelNew`) timed 3-12 % slower as a candidate than as the
reference on the H200 (4x for a launch-bound model), by the candidate process's own CUDA events
too. Between two timed calls of a candidate the harness compares the last output (a parallel
torch op); the reference's outputs are only stored. libgomp's threads spin after each parallel
op, so on a 16-core host the harness's team competes with the worker that launches the next
call. `evaluator.harness.cputhreads.one_cpu_thread` keeps the served-call loop on one thread.

`--cpu`: a child process pinned to one core runs a fixed Python loop right after this process
ran a parallel op (and, as control, after it stayed idle), with N intra-op threads and with
one, alternating; printed: the
median loop time after the op over the idle one (1.00: no interference).

GPU: each model is evaluated (strict, eager baseline) with the harness on one thread and, in
this bench only, with the setting left to torch's default, alternating, `--repeats` times.
Printed per run: the candidate's own event median and trusted median, the reference worker's
event median, their ratio and the speedup of identical code (1.000 is fair). Diagnostic only.
"""

from __future__ import annotations

import argparse
import contextlib
import multiprocessing as mp
import os
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "bench")]


def _victim(conn, core: int) -> None:
    os.sched_setaffinity(0, {core})
    while conn.recv():
        time.sleep(0.001)
        t = time.perf_counter()
        x = 0
        for i in range(100_000):
            x += i
        conn.send(time.perf_counter() - t)


def cpu_mechanism(threads: int, rounds: int = 60) -> float:
    import torch

    torch.set_num_threads(threads)
    x = torch.randn(4_000_000)
    cores = sorted(os.sched_getaffinity(0))
    a, b = mp.Pipe()
    p = mp.get_context("fork").Process(target=_victim, args=(b, cores[-1]))
    p.start()
    times: dict[str, list[float]] = {"idle": [], "op": []}
    for _ in range(rounds):
        for mode in times:
            time.sleep(0.05)
            if mode == "op":
                (x.abs() - 1).max()
            a.send(True)
            times[mode].append(a.recv())
    a.send(False)
    p.join()
    return statistics.median(times["op"]) / statistics.median(times["idle"])


def gpu(only: list[str], repeats: int) -> None:
    from clock import MODELS, honest_source

    from evaluator import pipeline
    from evaluator.config import EvalConfig
    from evaluator.harness import served

    one = served.one_cpu_thread
    print(f"{'model':<12} {'harness':>8} {'cand ev':>8} {'trusted':>8} {'ref ev':>8} "
          f"{'cand/ref ev':>11} {'speedup':>8}", flush=True)
    for label, pid, overrides in MODELS:
        if label not in only:
            continue
        cfg = EvalConfig(device="cuda", baselines="eager", profile=False,
                         cache_dir=Path("/tmp/kloop-bench-threads"), problem_overrides=overrides)
        ratios: dict[str, list[float]] = {"1 thread": [], "default": []}
        for _ in range(repeats):
            for mode in ratios:
                patch = one if mode == "1 thread" else contextlib.nullcontext
                served.one_cpu_thread = patch
                try:
                    r = pipeline.evaluate(pid, honest_source(pid), cfg)
                finally:
                    served.one_cpu_thread = one
                t, e = r.timing, r.eager
                if r.status != "correct" or t is None or e is None:
                    print(f"{label:<12} {mode:>8} {r.status}: {r.error}", flush=True)
                    continue
                cand, ref = t.worker_event_median_ms, e.worker_event_median_ms
                ratio = cand / ref if cand and ref else float("nan")
                ratios[mode].append(ratio)
                print(f"{label:<12} {mode:>8} {cand or 0:>8.4f} {t.median_ms:>8.4f} "
                      f"{ref or 0:>8.4f} {ratio:>11.3f} {r.speedup_vs_eager or 0:>8.3f}",
                      flush=True)
        for mode, vals in ratios.items():
            if vals:
                print(f"{label:<12} {mode:>8} median cand/ref events "
                      f"{statistics.median(vals):.3f}", flush=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cpu", action="store_true", help="the mechanism only, no GPU")
    ap.add_argument("--only", default="L3/1-b8,L3/1-b1024,L3/1,L3/4")
    ap.add_argument("--repeats", type=int, default=2)
    args = ap.parse_args()
    if args.cpu:
        n = os.cpu_count() or 2
        for threads in (n, 1):
            print(f"{threads:>2} intra-op threads: after a parallel op / after idle = "
                  f"{cpu_mechanism(threads):.2f}", flush=True)
        return 0
    gpu(args.only.split(","), args.repeats)
    return 0


if __name__ == "__main__":
    sys.exit(main())
