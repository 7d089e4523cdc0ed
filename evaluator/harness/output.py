"""A served call's outputs as the harness holds them after the call's clock stopped: a copy.

Small outputs are copied inside the clock. Large ones are copied right after it, whole and in
order, into a buffer the channel keeps for the session: up to c8554dc each call copied a 200 MB
output three times into fresh memory (a `pread`, a slice, a `bytearray`; 0.22 s a call at
192 MB, half a minute of the device lock for 100 timed calls of L3/43 at full size), and one
copy into memory already mapped takes ~17 ms there (`bench/output_read.py`).

Why a copy, and a whole one, although a large output is checked only at 16 384 secret
positions (`evaluator.harness.expected`): the shared memory is mapped in the candidate's
process too. Reading only those positions in place would show them to it (flush a line,
time reloading it: a shared page's cache lines reveal who touched them), and with the same
positions for every call a candidate could then compute only those elements. A whole
sequential copy touches every line alike, and the checks then read only harness-private
memory. It also freezes the output: the late-write check compares the clock's sampled lines
with this copy, and what is judged is this copy, so nothing written afterwards counts.

An `Output` is valid until the channel's next request (the buffer is reused): it is read in
the `on_output` callback (`evaluator.harness.served.run_plan`), before the next call is sent.
"""

from __future__ import annotations

import math
import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import torch

from kloop.evaluator.common.wire import DTYPES, ServeLayout

LINE = 64
"""The unit of the clock's snapshot (bytes)."""

PARALLEL_COPY_BYTES = 64 << 20
"""Outputs this large are copied by `COPY_THREADS` threads, each a contiguous share in order.
Why: the copy runs after every timed call of the candidate, between two calls of the rounds,
and on one thread it streams at ~13 GB/s (the CPU host; 1 GB in 81 ms, in 49 ms on its two
cores, 2026-12-06): 0.3 s a call for L3/17's 4.3 GB output at full size. numpy lets go of the
GIL while it copies. Every line is still read, so no position is singled out."""
COPY_THREADS = 4

_pool: ThreadPoolExecutor | None = None
_pool_lock = threading.Lock()


def copy_whole(dst: np.ndarray, src: np.ndarray) -> None:
    """`dst[:] = src` (flat uint8 arrays of one size), in contiguous shares on several threads
    when large; returns once every byte is copied."""
    n = src.size
    if n < PARALLEL_COPY_BYTES or COPY_THREADS < 2:
        np.copyto(dst, src)
        return
    global _pool
    with _pool_lock:
        if _pool is None:
            _pool = ThreadPoolExecutor(COPY_THREADS, thread_name_prefix="kloop-copy")
    share = -(-n // COPY_THREADS)
    share += -share % LINE  # shares start on a line
    jobs = [_pool.submit(np.copyto, dst[at:at + share], src[at:at + share])
            for at in range(0, n, share)]
    for j in jobs:
        j.result()


class Output:
    def __init__(self, layout: ServeLayout, buf: np.ndarray):
        """`buf`: a copy of the whole shared memory (uint8, `layout.total` bytes)."""
        self.layout = layout
        self.buf = buf

    def lines(self, pick: np.ndarray) -> np.ndarray:
        """A copy of the `LINE`-byte lines at `pick` (the clock's late-write check)."""
        return self.buf.reshape(-1, LINE)[pick]

    def numel(self, k: int) -> int:
        return math.prod(self.layout.slots[k].shape)

    def whole(self, k: int) -> torch.Tensor:
        """Output `k`, as a tensor of its own."""
        s = self.layout.slots[k]
        dtype = DTYPES[s.dtype]
        if s.nbytes == 0:
            return torch.empty(s.shape, dtype=dtype)
        raw = torch.from_numpy(self.buf[s.offset:s.offset + s.nbytes].copy())
        return raw.view(dtype).reshape(s.shape)

    def at(self, k: int, positions: torch.Tensor) -> torch.Tensor:
        """The elements of output `k` (flattened) at `positions`, as a tensor of their own:
        what `whole(k).reshape(-1)[positions]` holds, without copying the rest again."""
        s = self.layout.slots[k]
        dtype = DTYPES[s.dtype]
        size = torch.empty((), dtype=dtype).element_size()
        elements = self.buf[s.offset:s.offset + s.nbytes].reshape(-1, size)
        picked = np.ascontiguousarray(elements[positions.numpy()])  # fancy indexing copies
        return torch.from_numpy(picked).view(dtype).reshape(-1)

    def tensors(self) -> list[torch.Tensor]:
        """Every output, as tensors of their own."""
        return [self.whole(k) for k in range(len(self.layout.slots))]
