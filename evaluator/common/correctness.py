"""Output comparison in the harness: one `OutputDiff` per output tensor.

The test is `torch.allclose` semantics, elementwise |got - expected| <= atol + rtol*|expected|
with atol = rtol = the policy's tolerance; NaN never matches (not even NaN), an infinity
matches only the same infinity. Only plain `torch.Tensor` outputs are accepted.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from kloop.evaluator.common.result import OutputDiff, WorstElement

N_WORST = 5


def compare_outputs(expected: list[Any], got: list[Any], got_types: list[str],
                    tol: float) -> list[OutputDiff]:
    """Compare every expected output with what the candidate returned (same position)."""
    if len(got) != len(expected):
        first = expected[0] if expected else None
        return [OutputDiff(
            ok=False, expected_shape=list(first.shape) if first is not None else [],
            expected_dtype=str(first.dtype) if first is not None else "none",
            message=f"returned {len(got)} outputs, expected {len(expected)}",
        )]
    return [
        compare_tensor(i, e, g, t, tol)
        for i, (e, g, t) in enumerate(zip(expected, got, got_types, strict=True))
    ]


def compare_tensor(index: int, expected: torch.Tensor, got: Any, got_type: str,
                   tol: float) -> OutputDiff:
    base = dict(output_index=index, expected_shape=list(expected.shape),
                expected_dtype=str(expected.dtype))
    if got_type != "torch.Tensor" or not isinstance(got, torch.Tensor):
        return OutputDiff(ok=False, got_type=got_type, **base,
                          message=f"output {index} is a {got_type}, not a plain torch.Tensor")
    base.update(got_shape=list(got.shape), got_dtype=str(got.dtype))
    if got.shape != expected.shape:
        return OutputDiff(ok=False, **base, message=f"shape {list(got.shape)} != expected "
                          f"{list(expected.shape)}")
    if got.dtype != expected.dtype:
        return OutputDiff(ok=False, **base, message=f"dtype {got.dtype} != expected "
                          f"{expected.dtype}")
    return _compare_values(expected, got, tol, base)


CHUNK = 1 << 16
"""Elements compared at a time. Why: the harness compares on one CPU thread while the candidate
holds the device, and each of the test's dozen whole-tensor passes over a large output streams
it from memory; chunks of 64 Ki elements keep every pass in the core's cache. A 134 MB output
(L3/46 at full size) took 1.23 s whole and 0.2 s chunked on the 2-core CPU host (2026-12-06,
`bench/compare_speed.py`), and a full-size L3/46 candidate spent 10-14 s of its device hold in
the trials' comparisons on an H100 (bench/experiment.py part 1/9, 2026-12-06)."""


class _Tally:
    """What the chunks of one comparison add up to."""

    def __init__(self) -> None:
        self.nan_e = self.nan_g = self.inf_e = self.inf_g = self.mismatch = 0
        self.max_abs = self.max_rel = float("-inf")  # -inf: no element kept yet
        self.worst: list[tuple[float, int]] = []  # (excess, flat index), failing elements only


def _chunk(e: torch.Tensor, g: torch.Tensor, tol: float, at: int, t: _Tally) -> None:
    """One chunk's part of the test (never empty), decided element by element exactly as on the
    whole."""
    ae = e.abs()
    diff = (g - e).abs_()
    top = float(diff.max())
    # Both sides finite when these maxima are (a NaN anywhere makes them NaN, an infinity in
    # either side makes one infinite): two passes instead of `isfinite`'s four. A difference
    # that overflows takes the masked path below although nothing is infinite; it decides
    # every element alike (the masks change nothing for finite ones), only slower.
    finite_in = math.isfinite(top) and math.isfinite(float(ae.max()))
    bound = ae.mul(tol).add_(tol)
    if finite_in:  # the usual case: no NaN or infinity to count, no mask to apply
        ok = diff <= bound
    else:
        t.nan_e += int(e.isnan().count_nonzero())
        t.nan_g += int(g.isnan().count_nonzero())
        t.inf_e += int(e.isinf().count_nonzero())
        t.inf_g += int(g.isinf().count_nonzero())
        # An infinity (on either side) matches only the same infinity; NaN matches nothing.
        same_inf = e.isinf() & (e == g)
        diff = torch.where(same_inf, torch.zeros_like(diff), diff)
        ok = torch.where(e.isinf() | g.isinf(), same_inf, diff <= bound)
        ok &= ~(e.isnan() | g.isnan())
    failing = ok.numel() - int(ok.count_nonzero())
    t.mismatch += failing
    # Maxima over masked elements without selecting them (a boolean selection of a 50 M element
    # output took 3.7 of 8.3 s on one thread); kept elements are >= 0, so -inf marks none.
    if finite_in:  # every difference finite: the mask would keep them all
        t.max_abs = max(t.max_abs, top)
        rel = (diff / ae).masked_fill_(ae == 0, float("-inf"))
    else:
        finite = diff.isfinite()
        t.max_abs = max(t.max_abs, float(torch.where(finite, diff, float("-inf")).max()))
        rel = torch.where(finite & (e != 0), diff / ae, float("-inf"))
    t.max_rel = max(t.max_rel, float(rel.max()))
    if failing:
        excess = (diff - bound).masked_fill_(ok, float("-inf"))
        if not finite_in:  # a NaN difference ranks as an infinite excess
            excess.masked_fill_(diff.isnan() & ~ok, float("inf"))
        top_k = torch.topk(excess, min(N_WORST, failing))
        t.worst.extend(zip(top_k.values.tolist(), (top_k.indices + at).tolist(), strict=True))


def _compare_values(expected: torch.Tensor, got: torch.Tensor, tol: float,
                    base: dict[str, Any]) -> OutputDiff:
    wide = torch.float64 if expected.dtype == torch.float64 else torch.float32
    ef, gf = expected.reshape(-1), got.reshape(-1)
    n, t = ef.numel(), _Tally()
    for at in range(0, n, CHUNK):
        _chunk(ef[at:at + CHUNK].to(wide), gf[at:at + CHUNK].to(wide), tol, at, t)
    # The failing elements furthest outside their bound (NaN and inf first: an excess of NaN,
    # from inf - inf, ranks above all as in `torch.topk`); among equal excesses, the first in
    # memory.
    worst = sorted(t.worst, key=lambda x: (not math.isnan(x[0]),
                                           0.0 if math.isnan(x[0]) else -x[0], x[1]))[:N_WORST]
    return OutputDiff(
        ok=t.mismatch == 0, **base,
        max_abs_err=None if t.max_abs == float("-inf") else t.max_abs,
        max_rel_err=None if t.max_rel == float("-inf") else t.max_rel,
        mismatch_fraction=t.mismatch / n if n else 0.0,
        worst=[_element(expected, got, i, wide) for _, i in worst],
        nan_expected=t.nan_e, nan_got=t.nan_g, inf_expected=t.inf_e, inf_got=t.inf_g,
        message=None if t.mismatch == 0 else
        f"{t.mismatch} of {n} elements outside tolerance {tol:g}",
    )


def _element(expected: torch.Tensor, got: torch.Tensor, i: int, wide: torch.dtype
             ) -> WorstElement:
    index = [int(x) for x in torch.unravel_index(torch.tensor(i), expected.shape)] \
        if expected.dim() else []
    return WorstElement(index=index, expected=float(expected.reshape(-1)[i].to(wide)),
                        got=float(got.reshape(-1)[i].to(wide)))
