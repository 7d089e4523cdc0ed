"""What the harness pays, per timed call and off the clock, to check a large served output
(any machine: it is host memory work). Side by side in one run, for each output size:

- `3 copies`: the path up to c8554dc (a `pread` of the whole shared memory into fresh memory,
  a slice, a `bytearray`, then the kept elements taken from the tensor);
- `kept copy`: the path now, `CallChannel._after`: one whole copy into a buffer kept for the
  session (`evaluator.harness.output` says why whole), the kept elements read from it;
- `in place`: the kept elements read straight from the shared memory, for reference only (it
  would show the secret positions to the candidate's process, which maps the same memory).

All feed the same `ExpectedStore` (sampled past 512 MB over all calls, as on the GPU) and must
keep bit-identical elements; printed: ms per call for the reference's `add` and the candidate's
`passes`, and the ratios to the first path.

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

from kloop.evaluator.harness.expected import ExpectedStore  # noqa: E402
from kloop.evaluator.harness.output import Output  # noqa: E402
from kloop.evaluator.worker.serve import DTYPES, ServeLayout  # noqa: E402


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
    print(f"{'output':>8} {'path':>11} {'add ms':>8} {'passes ms':>10}")
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
        kept_buf = np.empty(layout.total, dtype=np.uint8)

        def kept_copy(layout=layout, live=live, kept_buf=kept_buf) -> Output:
            np.copyto(kept_buf, live)
            return Output(layout, kept_buf)

        kept_copy()  # the buffer's pages, once per session
        for name, read in (("3 copies", lambda layout=layout, fd=fd: copied(layout, fd)),
                           ("kept copy", kept_copy),
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
            print(f"{text:>8} {name:>11} {times[name][0]:8.2f} {times[name][1]:10.2f}")
        for name in ("kept copy", "in place"):
            assert all(torch.equal(a, b) for a, b in zip(kept["3 copies"], kept[name],
                                                         strict=True))
            old, new = times["3 copies"], times[name]
            print(f"{text:>8} {'x ' + name:>11} {old[0] / new[0]:6.0f}x {old[1] / new[1]:9.0f}x"
                  f"  (sampled: {store.sampled})")
        os.close(fd)  # the map goes with its last view
    return 0


if __name__ == "__main__":
    sys.exit(main())
