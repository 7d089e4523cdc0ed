"""What the harness pays, per timed call and off the clock, to check a large served output
(any machine: it is host memory work). Side by side in one run, for each output size:

- `copy`: the path before `Output` (up to c8554dc: a `pread` of the whole shared memory, a slice, a `bytearray`,
  then the kept elements taken from the tensor);
- `in place`: `evaluator.harness.output.Output` over the shared memory, reading only the kept
  elements (the path now).

Both feed the same `ExpectedStore` (sampled past 512 MB over all calls, as on the GPU) and must
keep bit-identical elements; printed: ms per call for the reference's `add` and the candidate's
`passes`, and the ratio.

    python bench/output_read.py [--sizes 8M,64M,192M] [--calls 20]
"""

from __future__ import annotations

import argparse
import mmap
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path[:0] = [str(Path(__file__).resolve().parents[1])]

from evaluator.harness.expected import ExpectedStore  # noqa: E402
from evaluator.harness.output import Output  # noqa: E402
from evaluator.worker.serve import DTYPES, ServeLayout  # noqa: E402


def copied(layout: ServeLayout, fd: int) -> list[torch.Tensor]:
    """The whole-copy read, as the harness did it before `Output`."""
    data = os.pread(fd, layout.total, 0)
    return [torch.frombuffer(bytearray(data[s.offset:s.offset + s.nbytes]),
                             dtype=DTYPES[s.dtype]).reshape(s.shape) for s in layout.slots]


def size(text: str) -> int:
    return int(text[:-1]) << {"K": 10, "M": 20, "G": 30}[text[-1]]


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", default="8M,64M,192M")
    ap.add_argument("--calls", type=int, default=20, help="timed calls per path and size")
    args = ap.parse_args()
    torch.set_num_threads(1)  # the harness checks on one CPU thread (harness.cputhreads)
    print(f"{'output':>8} {'path':>9} {'add ms':>8} {'passes ms':>10}")
    for text in args.sizes.split(","):
        n = size(text) // 4
        layout = ServeLayout.of([([n], "torch.float32")])
        fd = os.memfd_create("bench-output")
        os.ftruncate(fd, layout.total)
        os.pwrite(fd, torch.randn(n).numpy().tobytes(), 0)
        mm = mmap.mmap(fd, layout.total, prot=mmap.PROT_READ)
        live = np.frombuffer(mm, dtype=np.uint8)
        times: dict[str, tuple[float, float]] = {}
        kept: dict[str, list[torch.Tensor]] = {}
        store = ExpectedStore(n_calls=100)
        store.add(0, Output(layout, live))  # fixes the positions both paths then use
        for name, read in (("copy", lambda layout=layout, fd=fd: copied(layout, fd)),
                           ("in place", lambda layout=layout, live=live: Output(layout, live))):
            adds, checks = [], []
            for _ in range(args.calls):
                t = time.perf_counter()
                store.add(1, read())
                adds.append(time.perf_counter() - t)
                t = time.perf_counter()
                assert store.passes(1, read(), 1e-4)
                checks.append(time.perf_counter() - t)
            kept[name] = store.outputs[1]
            times[name] = (statistics.median(adds) * 1e3, statistics.median(checks) * 1e3)
            print(f"{text:>8} {name:>9} {times[name][0]:8.2f} {times[name][1]:10.2f}")
        assert all(torch.equal(a, b) for a, b in zip(kept["copy"], kept["in place"], strict=True))
        old, new = times["copy"], times["in place"]
        print(f"{text:>8} {'ratio':>9} {old[0] / new[0]:7.0f}x {old[1] / new[1]:9.0f}x  "
              f"(sampled: {store.sampled})")
        os.close(fd)  # the map goes with its last view
    return 0


if __name__ == "__main__":
    sys.exit(main())
