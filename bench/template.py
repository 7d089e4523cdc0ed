"""Children forked from the template process vs started fresh, side by side in one run.

    python bench/template.py [--device cpu|cuda] [--n 5]

Evaluates the same plain-PyTorch candidate for L3/1 (small sizes) `n` times each way,
alternating, and prints the median wall time of a whole evaluation and of its reference and
candidate stages (process start included), with the ratio fresh / template. Fresh: templates
that cannot be used here (`eval_helpers.plain_start`), as where children fall back to fresh
interpreters.
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "tests" / "evaluator")]

from eval_helpers import MLP_SMALL, candidate, plain_start  # noqa: E402

from kloop.evaluator.common.config import EvalConfig  # noqa: E402
from kloop.evaluator.harness.pipeline import evaluate  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--n", type=int, default=5)
    args = ap.parse_args()
    cache = Path(tempfile.mkdtemp(prefix="kloop-bench-template-"))
    rows: dict[bool, list[tuple[float, float, float]]] = {True: [], False: []}
    src = candidate("mlp_torch.py")
    for i in range(args.n + 1):
        for template in (True, False):
            cfg = EvalConfig(device=args.device, cache_dir=cache, baselines="eager",
                             profile=False, triton_aot=False, problem_overrides=MLP_SMALL)
            with contextlib.nullcontext() if template else plain_start():
                t0 = time.monotonic()
                r = evaluate("L3/1", src, cfg)
                wall = time.monotonic() - t0
            assert r.status == "correct", r.error
            if i:  # the first round starts the template and warms caches
                s = r.stage_seconds
                rows[template].append((wall, s.get("reference", 0.0), s.get("candidate", 0.0)))
    print(f"{'':>10} {'evaluation':>10} {'reference':>10} {'candidate':>10}  (median s, n={args.n})")
    med = {k: [statistics.median(col) for col in zip(*v, strict=True)] for k, v in rows.items()}
    for template in (False, True):
        name = "template" if template else "fresh"
        print(f"{name:>10} " + " ".join(f"{x:>10.2f}" for x in med[template]))
    print(f"{'ratio':>10} " + " ".join(f"{a / b:>10.2f}" for a, b in
                                       zip(med[False], med[True], strict=True)))


if __name__ == "__main__":
    main()
