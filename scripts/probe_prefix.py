"""How much of a sequence moves the output beyond the tolerance, per sequence problem.

A recurrence that forgets its start can be computed from its last steps alone: on L3/36 the last
64 of 512 LSTM steps give the final hidden state to fp32 rounding, so a candidate that runs only
those is `correct` at a seventh of the work. The degeneracy check (scripts/probe_degenerate.py)
asks only whether the output depends on the input at all; this asks on how much of it.

For each problem of `SEQUENCES`, on CPU in fp32, at the sizes of `SIZES` (full size unless a
forward takes too long there; the batch is what gets reduced, never the sequence), under an input
distribution (KernelBench's own `get_inputs()`, or strict's: a `noisy_model` build and inputs
drawn as `ProblemMeta.prefix.strict_input_scale` * x + `strict_input_shift`; `--scale` and
`--shift` try another), it compares the output of a normal trial with the output after
  prefix  — steps [0, T-k) of the sequence replaced by another draw's (initial states kept):
            the smallest k on `ladder(T)` where the output stays within the tolerance is the
            number of steps that matter (the last k);
  ends    — bidirectional problems: steps [m, T-m) replaced; the steps that matter are 2m;
  attack  — the same model run on the k steps that matter alone (the prefix dropped, the
            given initial states used): does that truncated run pass at the tolerance?
Where the output has a step axis (a sequence of outputs) only its last step is compared: a
windowed candidate computes every output from the k steps before it.

"Within the tolerance" is `torch.allclose(atol=rtol=tol)`: max |a-b| / (1+|b|) <= tol.
Run: python scripts/probe_prefix.py [--strict] [--json] [--only 36,37]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from types import ModuleType
from typing import Any, NamedTuple

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from kloop.evaluator.common.config import POLICIES  # noqa: E402
from kloop.evaluator.common.protocol import ProblemSpec  # noqa: E402
from kloop.evaluator.worker.construct import (  # noqa: E402
    as_output_list,
    construct,
    draw_inputs,
    init_inputs,
    noisy_model,
)
from kloop.problems.registry import Problem, get_problem  # noqa: E402


class Sequence(NamedTuple):
    length: str
    """The module constant holding the sequence length."""
    axis: int
    """The step axis of input 0."""
    out_axis: int | None = None
    """The step axis of the output, where it is a sequence of outputs."""
    shaped: bool = False
    """The parameters are shaped by the length: a run on fewer steps is not possible."""


SEQUENCES: dict[int, Sequence] = {
    34: Sequence("sequence_length", 0, 0), 35: Sequence("sequence_length", 1),
    36: Sequence("sequence_length", 1), 37: Sequence("sequence_length", 1),
    38: Sequence("sequence_length", 1), 39: Sequence("seq_len", 0, 0),
    40: Sequence("seq_len", 0), 41: Sequence("seq_len", 0, 0), 42: Sequence("seq_len", 0),
    43: Sequence("seq_len", 1, 1), 44: Sequence("seq_len", 1, 1),
    50: Sequence("max_seqlen", 1, 1),
    48: Sequence("seq_length", 1, 1, shaped=True), 49: Sequence("seq_length", 1, shaped=True),
}
BIDIRECTIONAL = {38, 41, 42}
# Module constants overridden for the measurement: a full-size forward of these takes more than
# a few seconds on one CPU thread. Only the batch shrinks (each sample is its own sequence);
# Mamba-2's parameters are shaped by the batch, the fingerprint size is kept there.
SIZES: dict[int, dict[str, Any]] = {43: {"batch_size": 2}, 44: {"batch_size": 2},
                                    50: {"batch_size": 2}, 48: {"batch_size": 16},
                                    49: {"batch_size": 16}}
CONSTRUCTION_SEED = 1234567


def ladder(steps: int) -> list[int]:
    """Candidate numbers of steps that matter: 1/64 .. 15/16 of the sequence, then all of it."""
    rungs = [steps * n // d for n, d in ((1, 64), (1, 32), (1, 16), (1, 8), (3, 16), (1, 4),
                                          (3, 8), (1, 2), (3, 4), (7, 8), (15, 16))]
    return sorted({k for k in rungs if 0 < k < steps}) + [steps]


def ratio(a: list[torch.Tensor], b: list[torch.Tensor]) -> float:
    """The smallest atol = rtol at which `a` passes against `b`."""
    return max(float(((x - y).abs() / (1 + y.abs())).max()) for x, y in zip(a, b, strict=True))


def strict_distribution(problem: Problem) -> tuple[float | None, float | None]:
    """Strict's (input scale, input shift) for this problem at fp32: the whole-sequence
    distribution where there is one, else the degenerate problem's, else none."""
    meta = problem.meta
    if meta.prefix is not None and meta.prefix.strict_input_scale is not None:
        return meta.prefix.strict_input_scale, meta.prefix.strict_input_shift
    if meta.degenerate_probe == "scaled_inputs":
        return meta.degenerate_input_scale, meta.degenerate_input_shift
    return None, None


class Setup:
    """One problem built for one input distribution."""

    def __init__(self, problem: Problem, strict: bool, scale: float | None = None,
                 shift: float | None = None, overrides: dict[str, Any] | None = None):
        self.problem, self.seq = problem, SEQUENCES[problem.number]
        self.axis = self.seq.axis
        self.overrides = SIZES.get(problem.number, {}) if overrides is None else overrides
        if scale is None and shift is None and strict:
            scale, shift = strict_distribution(problem)
        self.scale, self.shift = scale, shift
        self.spec = ProblemSpec(path=str(problem.path), sha256=problem.sha256,
                                overrides=self.overrides, device="cpu", precision="fp32",
                                allow_tf32=False, input_scale=scale, input_shift=shift)
        self.module: ModuleType = problem.load_module(self.overrides)
        self.steps = int(getattr(self.module, self.seq.length))
        init = init_inputs(self.module, self.spec)
        self.model = (noisy_model(self.module.Model, init, self.spec, CONSTRUCTION_SEED) if strict
                      else construct(self.module.Model, init, self.spec))
        self.inputs = draw_inputs(self.module, 1, self.spec)
        self.other = draw_inputs(self.module, 2, self.spec)
        assert self.inputs[0].shape[self.axis] == self.steps, (problem.id, self.inputs[0].shape)

    def last(self, inputs: list[Any]) -> list[torch.Tensor]:
        """The output; of a sequence of outputs, its last step."""
        torch.manual_seed(7)  # L3/35 draws its initial states in forward
        with torch.no_grad():
            outs = [o.float() for o in as_output_list(self.model(*inputs))]
        if self.seq.out_axis is None:
            return outs
        return [o.select(self.seq.out_axis, -1) for o in outs]

    def replaced(self, lo: int, hi: int) -> list[Any]:
        """The normal trial's inputs with steps [lo, hi) of the sequence from the other draw."""
        x = self.inputs[0].clone()
        idx = [slice(None)] * x.dim()
        idx[self.axis] = slice(lo, hi)
        x[tuple(idx)] = self.other[0][tuple(idx)]
        return [x, *self.inputs[1:]]

    def kept(self, k: int, window: str) -> list[Any]:
        """The normal trial's inputs with only k steps of the sequence: the last k, or the first
        and last k/2 (`window` "ends")."""
        x, T = self.inputs[0], self.steps
        if window == "ends":
            x = torch.cat([x.narrow(self.axis, 0, k // 2), x.narrow(self.axis, T - k // 2, k // 2)],
                          dim=self.axis)
        else:
            x = x.narrow(self.axis, T - k, k)
        return [x, *self.inputs[1:]]


def smallest(rungs: list[int], passes) -> tuple[int, dict[int, float]]:
    """Binary search for the smallest rung that passes (monotone: more steps kept, closer)."""
    seen: dict[int, float] = {}
    lo, hi = 0, len(rungs) - 1  # the last rung (every step) always passes
    while lo < hi:
        mid = (lo + hi) // 2
        ok, seen[rungs[mid]] = passes(rungs[mid])
        lo, hi = (lo, mid) if ok else (mid + 1, hi)
    return rungs[lo], seen


def probe(problem: Problem, strict: bool, tol: float, scale: float | None = None,
          shift: float | None = None, overrides: dict[str, Any] | None = None) -> dict[str, Any]:
    """One problem's row: steps that matter, the truncated run, the first half's effect."""
    t0 = time.monotonic()
    s = Setup(problem, strict, scale, shift, overrides)
    normal = s.last(s.inputs)
    T = s.steps

    def prefix(k: int) -> tuple[bool, float]:
        r = ratio(s.last(s.replaced(0, T - k)), normal)
        return r <= tol, r

    matter, seen = smallest(ladder(T), prefix)
    row: dict[str, Any] = {
        "problem": problem.id, "stem": problem.stem, "distribution": "strict" if strict
        else "kernelbench", "input_scale": s.scale, "input_shift": s.shift,
        "overrides": s.overrides, "steps": T, "tol": tol, "steps_that_matter": matter,
        "window": "last", "prefix_ratios": seen,
        "first_half_ratio": prefix(T - T // 2)[1],
    }
    if problem.number in BIDIRECTIONAL:
        def ends(two_m: int) -> tuple[bool, float]:
            m = two_m // 2
            r = ratio(s.last(s.replaced(m, T - m)), normal)
            return r <= tol, r

        both, seen_ends = smallest([k for k in ladder(T) if k % 2 == 0], ends)
        row["ends_ratios"] = seen_ends
        if both < matter:
            row["steps_that_matter"], row["window"] = both, "ends"
    if not s.seq.shaped:
        # The attack itself: the model run on fewer steps from the given initial states (which
        # a forgotten prefix would have replaced by a typical state: it can need more steps).
        def truncated(k: int) -> tuple[bool, float]:
            r = ratio(s.last(s.kept(k, row["window"])), normal)
            return r <= tol, r

        rungs = [k for k in ladder(T) if k >= row["steps_that_matter"]
                 and (row["window"] == "last" or k % 2 == 0)]
        row["truncated_steps"], row["truncated_ratios"] = smallest(rungs, truncated)
    row["seconds"] = round(time.monotonic() - t0, 1)
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--strict", action="store_true", help="strict's input distribution")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--scale", type=float, help="try this input scale under --strict")
    ap.add_argument("--shift", type=float, help="try this input shift under --strict")
    ap.add_argument("--only", default="", help="problem numbers, comma-separated")
    args = ap.parse_args()
    torch.set_num_threads(1)
    only = {int(n) for n in args.only.split(",") if n} or set(SEQUENCES)
    tol = POLICIES["strict"].tol_fp32
    assert tol == POLICIES["kernelbench"].tol_fp32
    rows = []
    for n in sorted(only):
        r = probe(get_problem(f"L3/{n}"), args.strict, tol, args.scale, args.shift)
        rows.append(r)
        attack = (f"; a run on {r['truncated_steps']} steps passes"
                  if r.get("truncated_steps", r["steps"]) < r["steps"] else "")
        print(f"{r['problem']:<6} {r['stem']:<26} {r['distribution']:<11} "
              f"{r['window']} {r['steps_that_matter']:>4} of {r['steps']} steps matter at "
              f"{tol:g}; first half replaced: {r['first_half_ratio']:.1e}{attack}  "
              f"[{r['seconds']} s]", flush=True)
    if args.json:
        print(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
