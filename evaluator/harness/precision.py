"""The precision check: an fp32 problem must be computed at about fp32's accuracy.

Both the candidate's output and the fp32 reference's are compared with a float64 run of the
reference on the same inputs (relative RMS error over all floating outputs; for an output past
`Policy.precision_sample_above` elements, over a million secret positions, the same for both:
`evaluator.common.sample`). A candidate whose
error is more than `Policy.precision_factor` times the reference's own (or the floor, fp32's
unit roundoff, when the reference's is smaller) computed in a lower precision. Why 100: an fp32
kernel that sums in another order, uses fused multiply-adds or fast-math intrinsics stays within
a few times the reference's error (measured on the honest suite); TF32 and fp16 carry 2^-11
relative rounding (about 8000 times fp32's 2^-24) and bf16 2^-8, so their errors land thousands
of times higher. 100 leaves an order of magnitude of room on either side.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import torch

from kloop.evaluator.common.correctness import CHUNK
from kloop.evaluator.common.result import PrecisionCheck
from kloop.evaluator.common.sample import Float64Outputs
from kloop.evaluator.harness.checks import violate
from kloop.evaluator.harness.outcome import Flagged, Precision, violated

if TYPE_CHECKING:
    from kloop.evaluator.harness.ledger import Ledger
    from kloop.evaluator.harness.state import EvalRun

FLOOR = 2.0 ** -24


def relative_rms(x: torch.Tensor, ref64: torch.Tensor) -> float | None:
    """||x - ref64|| / ||ref64||, in float64; None when it cannot be measured (non-finite
    values, an all-zero reference). Summed chunk by chunk (`correctness.CHUNK`: each chunk's
    float64 copies stay in cache; a whole 134 MB output took 0.84 s, chunked 0.04-0.07 s on
    one thread of the CPU host); the sums' order moves the result in its last bits only.
    A sum of squares is finite exactly when every term is (they are >= 0 and a NaN or an
    infinity stays in the sum), so no element needs a test of its own; a sum that overflows
    (elements beyond 1e154, which no fp32 output reaches) is not measured either."""
    xf, rf = x.reshape(-1), ref64.reshape(-1)
    dd = rr = 0.0
    for at in range(0, rf.numel(), CHUNK):
        r = rf[at:at + CHUNK].to(torch.float64)
        d = xf[at:at + CHUNK].to(torch.float64) - r
        dd += float(d.dot(d))
        rr += float(r.dot(r))
    if not (math.isfinite(dd) and math.isfinite(rr)):
        return None
    return math.sqrt(dd) / math.sqrt(rr) if rr > 0 else None


def _worst(outs: list[Any], outs64: Float64Outputs) -> float | None:
    errs = []
    for k, (x, r) in enumerate(zip(outs, outs64.outputs, strict=False)):
        x = outs64.pair(k, x)  # at the float64 output's positions where it was sampled
        if isinstance(x, torch.Tensor) and isinstance(r, torch.Tensor) and \
                x.is_floating_point() and r.is_floating_point() and x.shape == r.shape:
            e = relative_rms(x, r)
            if e is not None:
                errs.append(e)
    return max(errs) if errs else None


def precision_check(run: EvalRun, ledger: Ledger, got: list[Any], expected: list[Any],
                    expected64: Float64Outputs) -> None:
    factor = run.policy.precision_factor
    if factor is None:
        return
    cand, ref = _worst(got, expected64), _worst(expected, expected64)
    if cand is None or ref is None:
        ledger.record(Flagged(flag="precision_check_unavailable"))
        return
    ok = cand <= factor * max(ref, FLOOR)
    ledger.record(Precision(check=PrecisionCheck(candidate_rel_err=cand, reference_rel_err=ref,
                                                 factor=factor, floor=FLOOR, ok=ok,
                                                 positions=expected64.positions)))
    if not ok:
        ledger.record(*violated(violate(
            run, "precision_below_fp32", f"relative RMS error against float64 {cand:.2e}, the "
            f"fp32 reference's {ref:.2e} (more than {factor:g}x)")))


def precision_on_call(run: EvalRun, ledger: Ledger, index: int, got: list[Any],
                      outs64: Float64Outputs, reference_rel_err: float | None) -> None:
    """The same test on a timed call chosen in secret (`judge.served64`): the reference worker
    computed that call's float64 output and its own fp32 error for the call's seed. Timed
    calls look alike from inside the candidate's process, so a kernel that computes in fp32
    only where it can tell a probe trial from a timed call is caught here."""
    factor = run.policy.precision_factor
    if factor is None:
        return
    cand = _worst(got, outs64)
    if cand is None or reference_rel_err is None:
        ledger.record(Flagged(flag="precision_check_unavailable"))
        return
    ok = cand <= factor * max(reference_rel_err, FLOOR)
    ledger.record(Precision(check=PrecisionCheck(candidate_rel_err=cand,
                                                 reference_rel_err=reference_rel_err,
                                                 factor=factor, floor=FLOOR, ok=ok,
                                                 positions=outs64.positions),
                            timed_call=True))
    if not ok:
        ledger.record(*violated(violate(
            run, "precision_below_fp32", f"timed call {index}: relative RMS error against "
            f"float64 {cand:.2e}, the fp32 reference's {reference_rel_err:.2e} (more than "
            f"{factor:g}x)")))
