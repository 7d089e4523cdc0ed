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

GPU: each model is evaluated (strict, eager baseline) with the served-call loop on one thread
and, in this bench only, at torch's default, alternating, `--repeats` times
(bench/same_code_ab.py prints the columns). Diagnostic only.
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


@contextlib.contextmanager
def _default_threads():
    """The served-call loop left at torch's default thread count (this process only)."""
    from kloop.evaluator.harness import served

    one = served.one_cpu_thread
    served.one_cpu_thread = contextlib.nullcontext
    try:
        yield
    finally:
        served.one_cpu_thread = one


def gpu(only: list[str], repeats: int) -> None:
    import same_code_ab

    same_code_ab.run({"1 thread": contextlib.nullcontext, "default": _default_threads}, only,
                     repeats, "cuda", Path("/tmp/kloop-bench-threads"))


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
