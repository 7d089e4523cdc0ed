"""The full output comparison (`evaluator.common.correctness.compare_outputs`, every probe trial's and
the determinism check's, under the device lock) beside another checkout's, in one run (any
machine: it is host work).

    git worktree add /tmp/old c8554dc
    python bench/compare.py --other /tmp/old [--elements 50M] [--threads 1] [--repeats 3]

For an all-finite output pair and one with NaN and infinities: the median seconds of each
implementation, their ratio, and whether both returned the same records (they must).
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import sys
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO)]

from kloop.evaluator.common.correctness import compare_outputs  # noqa: E402


def load_other(root: Path):
    spec = importlib.util.spec_from_file_location(
        "other_correctness", root / "evaluator" / "correctness.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.compare_outputs


def pairs(n: int) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    gen = torch.Generator().manual_seed(0)
    e = torch.randn(n, generator=gen)
    g = e + 1e-6 * torch.randn(n, generator=gen)
    special_e, special_g = e.clone(), g.clone()
    idx = torch.randint(0, n, (64,), generator=gen)
    special_e[idx[:16]] = float("inf")
    special_g[idx[:16]] = float("inf")
    special_g[idx[16:32]] = float("nan")
    return {"finite": (e, g), "nan/inf": (special_e, special_g)}


def size(text: str) -> int:
    mult = {"K": 10**3, "M": 10**6}.get(text[-1], 1)
    return int(text[:-1] if text[-1] in "KM" else text) * mult


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--other", type=Path, required=True, help="another checkout's root")
    ap.add_argument("--elements", default="50M")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    other = load_other(args.other)
    print(f"{'case':8} {'other s':>8} {'this s':>7} {'ratio':>6} same")
    for name, (e, g) in pairs(size(args.elements)).items():
        times: dict[str, list[float]] = {"other": [], "this": []}
        results = {}
        for _ in range(args.repeats):
            for label, fn in (("other", other), ("this", compare_outputs)):
                t = time.perf_counter()
                results[label] = fn([e], [g], ["torch.Tensor"], 1e-4)
                times[label].append(time.perf_counter() - t)
        a, b = (statistics.median(times[k]) for k in ("other", "this"))
        same = [d.model_dump_json() for d in results["other"]] == \
            [d.model_dump_json() for d in results["this"]]
        print(f"{name:8} {a:8.2f} {b:7.2f} {a / b:5.1f}x {same}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
