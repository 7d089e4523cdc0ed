"""The reference's outputs for the timed calls, kept in the harness to check every timed call.

Kept whole while all of them fit in `FULL_BUDGET_BYTES`; past that (large outputs times many
calls) each output keeps `SAMPLES` elements at positions drawn secretly here, the same for every
call: an output wrong in a fraction f of its elements passes with probability (1 - f)^SAMPLES
(below 1e-28 for f = 1 %), and the probe trials before timing compare whole outputs anyway.
"""

from __future__ import annotations

import secrets

import torch

from evaluator.correctness import compare_outputs
from evaluator.result import OutputDiff

FULL_BUDGET_BYTES = 512 << 20
SAMPLES = 1 << 14


class ExpectedStore:
    def __init__(self, n_calls: int):
        self.n_calls = n_calls
        self.outputs: dict[int, list[torch.Tensor]] = {}
        self.positions: list[torch.Tensor | None] | None = None

    @property
    def sampled(self) -> bool:
        return bool(self.positions) and any(p is not None for p in self.positions or [])

    def add(self, index: int, outs: list[torch.Tensor]) -> None:
        if self.positions is None:
            total = sum(o.numel() * o.element_size() for o in outs) * self.n_calls
            gen = torch.Generator().manual_seed(secrets.randbits(62))
            self.positions = [
                None if total <= FULL_BUDGET_BYTES or o.numel() <= SAMPLES
                else torch.randint(0, o.numel(), (SAMPLES,), generator=gen)
                for o in outs
            ]
        self.outputs[index] = [self._keep(i, o) for i, o in enumerate(outs)]

    def _keep(self, i: int, o: torch.Tensor) -> torch.Tensor:
        assert self.positions is not None
        pos = self.positions[i] if i < len(self.positions) else None
        return o if pos is None else o.reshape(-1)[pos].clone()

    def passes(self, index: int, got: list[torch.Tensor], tol: float) -> bool:
        """Whether `compare` would find every output within tolerance, in a few passes instead
        of the diff statistics' dozen: it runs between two timed calls on one CPU thread
        (`evaluator.harness.cputhreads`), and only a failing call needs the statistics."""
        expected = self.outputs[index]
        if len(got) != len(expected):
            return False
        return all(_close(e, self._keep(i, g), tol) for i, (e, g) in
                   enumerate(zip(expected, got, strict=True)))

    def compare(self, index: int, got: list[torch.Tensor], tol: float) -> list[OutputDiff]:
        """The candidate's outputs of timed call `index` against the reference's."""
        expected = self.outputs[index]
        kept = [self._keep(i, g) if i < len(expected) else g for i, g in enumerate(got)]
        diffs = compare_outputs(expected, kept, ["torch.Tensor"] * len(kept), tol)
        if self.sampled:
            note = f" (checked at {SAMPLES} secret positions per output)"
            diffs = [d if d.ok else d.model_copy(update={"message": (d.message or "") + note})
                     for d in diffs]
        return diffs


def _close(e: torch.Tensor, g: torch.Tensor, tol: float) -> bool:
    """`evaluator.correctness`'s test for one output, as one `torch.isclose`: |g - e| <= tol +
    tol*|e| in the same widened precision, equal infinities match, NaN matches nothing."""
    if type(g) is not torch.Tensor or g.shape != e.shape or g.dtype != e.dtype or tol < 0:
        return False
    wide = torch.float64 if e.dtype == torch.float64 else torch.float32
    return bool(torch.isclose(g.to(wide), e.to(wide), rtol=tol, atol=tol).all())
