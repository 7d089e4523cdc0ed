"""What the ray executor adds per candidate, measured side by side with the local executor.

    python bench/ray_overhead.py [--rounds 4] [--device cpu]

Judges the same candidates (the bundled examples' L3/1 and L3/4 kernels at their small sizes:
correct, wrong, crashing) one at a time, alternating the two executors round by round so drift
hits both alike: `local` (kloop's evaluator in this process) and `ray` (one worker on a Ray
instance of this machine, a stand-in resource in place of a GPU on a CPU machine). Prints each
executor's median wall time per candidate, the difference (Ray's overhead per candidate: the
object store round trip, the actor call, the result's JSON), their ratio, and the bare round
trip of an empty actor call, and where Ray placed its worker: its device and the
`CUDA_VISIBLE_DEVICES` Ray gave it. Verdicts must match, and with `--device cuda` the worker
must be on a GPU that Ray named for it; the script exits 1 otherwise.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from kloop.agent.components import LocalEvaluator, load_problems  # noqa: E402
from kloop.agent.config import resolve  # noqa: E402
from kloop.agent.demo.kernels import SIZES, source  # noqa: E402
from kloop.agent.executor.ray_pool import RayEvaluator, close_pools, import_ray  # noqa: E402
from kloop.agent.executor.ray_worker import WorkerInfo  # noqa: E402

CASES = [("L3/1", "ok"), ("L3/1", "wrong"), ("L3/4", "ok"), ("L3/4", "crash")]


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--device", default="cpu")
    args = ap.parse_args()
    resource = "GPU" if args.device != "cpu" else "kslot"
    cfg = resolve([{
        "problems": sorted({p for p, _ in CASES}), "model": {"spec": "scripted:none.yaml"},
        # The examples' small sizes on a GPU too: what Ray adds is per candidate, not per FLOP,
        # and full sizes made one round of first use outlast the device call (2026-12-05).
        "problem_overrides": {p: SIZES[p] for p, _ in CASES},
        "eval": {"device": args.device},
        "executor": {"kind": "ray", "resource": resource, "worker_concurrency": 1}}])
    problems = {p.id: p for p in load_problems(cfg)}
    local = LocalEvaluator(cfg.eval, cfg.problem_overrides, list(problems.values()))
    remote = RayEvaluator(cfg, list(problems.values()))
    ray = import_ray()
    worker = remote.pool.workers[0].handle
    info = WorkerInfo.model_validate_json(ray.get(worker.hello.remote()))
    print(f"ray worker on {info.hardware}, CUDA_VISIBLE_DEVICES={info.visible_devices}, "
          f"pid {info.pid} (the driver's: {os.getpid()})")
    placed = args.device == "cpu" or (info.hardware != "cpu" and info.visible_devices is not None)
    trips = []
    for _ in range(20):
        t = time.perf_counter()
        ray.get(worker.hello.remote())
        trips.append(time.perf_counter() - t)
    walls: dict[str, list[float]] = {"local": [], "ray": []}
    verdicts: dict[str, list[str]] = {"local": [], "ray": []}
    for r in range(args.rounds + 1):  # round 0 warms both (baselines, imports, worker start)
        order = [("local", local), ("ray", remote)] if r % 2 else [("ray", remote), ("local", local)]
        for name, ev in order:
            for pid, variant in CASES:
                t = time.perf_counter()
                res = ev.evaluate(problems[pid], source(pid, variant))
                if r:
                    walls[name].append(time.perf_counter() - t)
                    verdicts[name].append(f"{pid}/{variant}:{res.status}")
    close_pools()
    med = {k: statistics.median(v) for k, v in walls.items()}
    print(f"{len(walls['local'])} candidates per executor, {args.rounds} rounds, device "
          f"{args.device}")
    print(f"{'executor':8} {'median s':>9} {'p90 s':>7}")
    for k, v in walls.items():
        print(f"{k:8} {med[k]:9.3f} {sorted(v)[int(0.9 * (len(v) - 1))]:7.3f}")
    print(f"ray overhead per candidate: {med['ray'] - med['local']:+.3f} s "
          f"(ray/local {med['ray'] / med['local']:.3f}); empty actor call "
          f"{statistics.median(trips) * 1e3:.2f} ms")
    same = sorted(verdicts["local"]) == sorted(verdicts["ray"])
    print("verdicts identical" if same else f"verdicts differ: {verdicts}")
    if not placed:
        print("the ray worker is not on a GPU that Ray placed it on")
    return 0 if same and placed else 1


if __name__ == "__main__":
    sys.exit(main())
