"""How long the harness's output checks take on one CPU thread, chunked against whole-tensor.

The harness judges each probe trial's outputs (the tolerance test with its statistics, the
float64 precision check, the determinism call's bitwise test) while the candidate holds the
device, on one CPU thread (`evaluator.harness.cputhreads`). This times each check at a size,
with the chunk the evaluator uses and with one chunk as large as the output (which is what the
checks did before they were chunked), alternating the two, and prints the ratio.

    python bench/compare_speed.py [--elements 33554432] [--repeats 5]

Defaults: L3/46's output at full size (2048 x 16384 float32, 134 MB).
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from kloop.evaluator.common import correctness
from kloop.evaluator.harness import checks, precision


def _checks(e: torch.Tensor, g: torch.Tensor, g2: torch.Tensor, e64: torch.Tensor) -> dict:
    return {
        "tolerance test": lambda: correctness.compare_outputs([e], [g], ["torch.Tensor"], 1e-4),
        "precision (relative RMS)": lambda: precision.relative_rms(g, e64),
        "determinism (bitwise)": lambda: checks._bitwise_equal([g], [g2]),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--elements", type=int, default=2048 * 16384)
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    torch.manual_seed(0)
    e = torch.rand(args.elements)
    g = e + 1e-7 * torch.randn_like(e)
    e64 = e.double()
    g2 = g.clone()
    chunked = correctness.CHUNK
    times: dict[str, dict[str, list[float]]] = {}
    for _ in range(args.repeats):
        for label, chunk in (("chunked", chunked), ("whole", max(args.elements, 1))):
            correctness.CHUNK = precision.CHUNK = checks.CHUNK = chunk
            for name, fn in _checks(e, g, g2, e64).items():
                t0 = time.perf_counter()
                fn()
                times.setdefault(name, {}).setdefault(label, []).append(time.perf_counter() - t0)
    correctness.CHUNK = precision.CHUNK = checks.CHUNK = chunked
    print(f"{args.elements} float32 elements ({args.elements * 4 / 1e6:.0f} MB), one CPU thread, "
          f"median of {args.repeats}, chunk {chunked} elements against one chunk of all:")
    for name, t in times.items():
        c, w = statistics.median(t["chunked"]), statistics.median(t["whole"])
        print(f"  {name:26s} chunked {c:7.3f} s   whole {w:7.3f} s   {w / c:5.1f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
