"""The reference's outputs for the timed calls, kept in the harness to check every timed call.

Kept whole while all of them fit in `FULL_BUDGET_BYTES`; past that (large outputs times many
calls) each output keeps `SAMPLES` elements at positions drawn secretly here, the same for every
call: an output wrong in a fraction f of its elements passes with probability (1 - f)^SAMPLES
(below 1e-28 for f = 1 %), and the probe trials before timing compare whole outputs anyway.
"""

from __future__ import annotations

import secrets
from collections.abc import Sequence

import torch

from kloop.evaluator.common.correctness import compare_outputs
from kloop.evaluator.common.result import OutputDiff
from kloop.evaluator.harness.output import Output

FULL_BUDGET_BYTES = 512 << 20
SAMPLES = 1 << 14


Outputs = Sequence[torch.Tensor] | Output
"""A call's outputs: tensors, or a served call's `Output`, of which only the kept elements are
ever read."""


class ExpectedStore:
    def __init__(self, n_calls: int):
        self.n_calls = n_calls
        self.outputs: dict[int, list[torch.Tensor]] = {}
        self.positions: list[torch.Tensor | None] | None = None

    @property
    def sampled(self) -> bool:
        return bool(self.positions) and any(p is not None for p in self.positions or [])

    def add(self, index: int, outs: Outputs) -> None:
        if self.positions is None:
            numels, nbytes = _sizes(outs)
            total = sum(nbytes) * self.n_calls
            gen = torch.Generator().manual_seed(secrets.randbits(62))
            self.positions = [
                None if total <= FULL_BUDGET_BYTES or n <= SAMPLES
                else torch.randint(0, n, (SAMPLES,), generator=gen)
                for n in numels
            ]
        self.outputs[index] = self._kept(outs)

    def _kept(self, outs: Outputs) -> list[torch.Tensor]:
        """What is kept (and compared) of each output: all of it, or its secret positions."""
        assert self.positions is not None
        if isinstance(outs, Output):
            return [outs.whole(k) if k >= len(self.positions) or self.positions[k] is None
                    else outs.at(k, self.positions[k]) for k in range(len(outs.layout.slots))]
        return [self._keep(i, o) for i, o in enumerate(outs)]

    def _keep(self, i: int, o: torch.Tensor) -> torch.Tensor:
        assert self.positions is not None
        pos = self.positions[i] if i < len(self.positions) else None
        return o if pos is None else o.reshape(-1)[pos].clone()

    def passes(self, index: int, got: Outputs, tol: float) -> bool:
        """Whether `compare` would find every output within tolerance, in a few passes instead
        of the diff statistics' dozen: it runs between two timed calls on one CPU thread
        (`evaluator.harness.cputhreads`), and only a failing call needs the statistics."""
        expected = self.outputs[index]
        kept = self._kept(got)
        if len(kept) != len(expected):
            return False
        return all(_close(e, g, tol) for e, g in zip(expected, kept, strict=True))

    def compare(self, index: int, got: Outputs, tol: float) -> list[OutputDiff]:
        """The candidate's outputs of timed call `index` against the reference's."""
        expected = self.outputs[index]
        kept = self._kept(got)
        diffs = compare_outputs(expected, kept, ["torch.Tensor"] * len(kept), tol)
        if self.sampled:
            note = f" (checked at {SAMPLES} secret positions per output)"
            diffs = [d if d.ok else d.model_copy(update={"message": (d.message or "") + note})
                     for d in diffs]
        return diffs


def _sizes(outs: Outputs) -> tuple[list[int], list[int]]:
    """Each output's element count and bytes."""
    if isinstance(outs, Output):
        return ([outs.numel(k) for k in range(len(outs.layout.slots))],
                [s.nbytes for s in outs.layout.slots])
    return [o.numel() for o in outs], [o.numel() * o.element_size() for o in outs]


def _close(e: torch.Tensor, g: torch.Tensor, tol: float) -> bool:
    """`evaluator.common.correctness`'s test for one output, as one `torch.isclose`: |g - e| <= tol +
    tol*|e| in the same widened precision, equal infinities match, NaN matches nothing."""
    if type(g) is not torch.Tensor or g.shape != e.shape or g.dtype != e.dtype or tol < 0:
        return False
    wide = torch.float64 if e.dtype == torch.float64 else torch.float32
    e, g = e.to(wide), g.to(wide)
    # A few in-place passes first (torch.isclose takes about ten: 6 ms against 1.8 ms for a
    # 4 MB output on one thread, which L3/1's rounds paid 50 times a candidate). Their yes is
    # isclose's: every |g - e| is finite (the bound is capped below infinity, and NaN compares
    # false) and within tol + tol*|e|. Anything else (a wrong element, NaN, equal infinities,
    # which isclose calls close) is decided by isclose itself.
    bound = e.abs().mul_(tol).add_(tol).clamp_(max=torch.finfo(wide).max)
    if bool(torch.sub(g, e).abs_().le_(bound).all()):
        return True
    return bool(torch.isclose(g, e, rtol=tol, atol=tol).all())
