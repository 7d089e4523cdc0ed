"""A served call's outputs as the harness reads them after the call's clock stopped.

Small outputs are a copy taken inside the clock. Large ones are read where they lie, in the
shared memory, and only as much of them as the check needs: the reference's outputs are kept at
secret positions once they are large (`evaluator.harness.expected`), so copying all of a 200 MB
output out three times per call (a `pread`, a slice, a `bytearray`) to look at 16 384 elements
of it cost ~0.3 s a call, half a minute of the device lock for 100 timed calls of L3/43 at its
full size. The positions are drawn in the harness and never leave it, so reading them in place
checks exactly the elements a copy would have.

An `Output` over the shared memory is valid until the channel's next request: it is read in the
`on_output` callback (`evaluator.harness.served.run_plan`), before the next call is sent.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from evaluator.worker.serve import DTYPES, ServeLayout

LINE = 64
"""The unit of the clock's snapshot (bytes)."""


class Output:
    def __init__(self, layout: ServeLayout, buf: np.ndarray,
                 snapshot: tuple[np.ndarray, np.ndarray] | None = None):
        """`buf`: the whole shared memory's bytes (uint8, `layout.total` of them), a copy taken
        inside the clock, or the memory itself with `snapshot`: the lines the clock sampled
        (`pick`) and their bytes when it stopped."""
        self.layout = layout
        self.buf = buf
        self.snapshot = snapshot

    def as_snapped(self) -> bool:
        """Whether the sampled lines still hold what they held when the clock stopped (always,
        for a copy). Checked before the output is read and again after (`served.run_plan`):
        what was judged was read between two checks, as it would have been from one copy."""
        if self.snapshot is None:
            return True
        pick, snap = self.snapshot
        return bool(np.array_equal(self.buf.reshape(-1, LINE)[pick], snap))

    def numel(self, k: int) -> int:
        return math.prod(self.layout.slots[k].shape)

    def whole(self, k: int) -> torch.Tensor:
        """Output `k`, copied out whole (a tensor of its own)."""
        s = self.layout.slots[k]
        dtype = DTYPES[s.dtype]
        if s.nbytes == 0:
            return torch.empty(s.shape, dtype=dtype)
        raw = torch.from_numpy(self.buf[s.offset:s.offset + s.nbytes].copy())
        return raw.view(dtype).reshape(s.shape)

    def at(self, k: int, positions: torch.Tensor) -> torch.Tensor:
        """The elements of output `k` (flattened) at `positions`, copied out: what
        `whole(k).reshape(-1)[positions]` holds, without copying the rest."""
        s = self.layout.slots[k]
        dtype = DTYPES[s.dtype]
        size = torch.empty((), dtype=dtype).element_size()
        elements = self.buf[s.offset:s.offset + s.nbytes].reshape(-1, size)
        picked = np.ascontiguousarray(elements[positions.numpy()])  # fancy indexing copies
        return torch.from_numpy(picked).view(dtype).reshape(-1)

    def tensors(self) -> list[torch.Tensor]:
        """Every output, copied out whole."""
        return [self.whole(k) for k in range(len(self.layout.slots))]
