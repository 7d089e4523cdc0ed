"""Which extra correctness trial makes a constant output fail, per degenerate Level 3 problem.

For each problem with `degenerate_at` in problems/level3_meta.json, at the reduced sizes of
tests/data/level3_fingerprints.json, on CPU in fp32, it builds the reference the way the
evaluator does and compares, at the problem's `degenerate_at` tolerance (`allclose`), the output
of a normal trial (seed-42 model, `get_inputs()`) with:
  other_input   — another normal trial (confirms the problem is degenerate at this size),
  scaled_inputs — strict's way: a model built by `noisy_model`, two calls whose inputs are
                  scale * get_inputs() for scale in SCALES; does the output depend on the input
                  there (then a cached output fails every call, and all calls look alike),
  reparam       — two `noisy_model` builds under other seeds, on the same normal inputs.
The chosen probe is the smallest scale at which the output depends on the input, else reparam if
the builds' outputs differ (a module-level cache fails it), else none. The result is what
scripts/make_problem_meta.py records. Run: python scripts/probe_degenerate.py [--json]
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from kloop.evaluator.common.protocol import ProblemSpec  # noqa: E402
from kloop.evaluator.worker.construct import (  # noqa: E402
    as_output_list,
    construct,
    draw_inputs,
    init_inputs,
    noisy_model,
)
from kloop.problems.registry import load_problem_set  # noqa: E402

SCALES = (3.0, 1e2, 1e4)


def _forward(model, inputs, seed: int = 7) -> list[torch.Tensor]:
    torch.manual_seed(seed)
    with torch.no_grad():
        return [o.float() for o in as_output_list(model(*inputs))]


def _agree(a: list[torch.Tensor], b: list[torch.Tensor], tol: float) -> bool:
    return all(torch.allclose(x, y, atol=tol, rtol=tol) for x, y in zip(a, b, strict=True))


def probe(problem, overrides: dict) -> dict:
    tol = problem.meta.degenerate_at
    base = dict(path=str(problem.path), sha256=problem.sha256, overrides=overrides, device="cpu",
                precision="fp32", allow_tf32=False)
    spec = ProblemSpec(**base)
    module = problem.load_module(overrides)
    model = construct(module.Model, init_inputs(module, spec), spec)
    normal = _forward(model, draw_inputs(module, 1, spec))
    row = {"problem": problem.id, "stem": problem.stem, "tol": tol, "overrides": overrides,
           "other_input_agrees": _agree(normal, _forward(model, draw_inputs(module, 2, spec)), tol)}
    # strict: every model built under a secret seed with noisy constant fills, every input of
    # every call scaled. The probe works when two calls' outputs differ at the tolerance.
    noisy = noisy_model(module.Model, init_inputs(module, spec), spec, 1234567)
    for scale in SCALES:
        scaled = ProblemSpec(**base, input_scale=scale)
        a = _forward(noisy, draw_inputs(module, 3, scaled))
        b = _forward(noisy, draw_inputs(module, 4, scaled))
        row[f"scaled_{scale:g}"] = {"input_dependent": not _agree(a, b, tol)}
    # Centred: 2x - 1 (get_inputs' rand draws become symmetric about zero).
    centred = ProblemSpec(**base, input_scale=2.0, input_shift=-1.0)
    row["centred"] = not _agree(_forward(noisy, draw_inputs(module, 3, centred)),
                                _forward(noisy, draw_inputs(module, 4, centred)), tol)
    other = noisy_model(module.Model, init_inputs(module, spec), spec, 7654321)
    row["reparam_differs"] = not _agree(_forward(noisy, draw_inputs(module, 4, spec)),
                                        _forward(other, draw_inputs(module, 4, spec)), tol)
    scale = next((s for s in SCALES if all(row[f"scaled_{s:g}"].values())), None)
    if scale is None and row["centred"]:
        scale, row["shift"] = 2.0, -1.0
    row["probe"] = ("scaled_inputs" if scale is not None
                    else "reparam" if row["reparam_differs"] else None)
    row["scale"] = scale
    return row


def main() -> None:
    torch.set_num_threads(2)
    fps = json.loads((ROOT / "tests/data/level3_fingerprints.json").read_text())["problems"]
    rows = []
    for problem in load_problem_set():
        if problem.meta.degenerate_at is None:
            continue
        rows.append(probe(problem, fps[problem.stem]["overrides"]))
        r = rows[-1]
        scaled = "  ".join(
            f"x{s:g}: input-dependent {r[f'scaled_{s:g}']['input_dependent']!s:<5}"
            for s in SCALES)
        print(f"{r['stem']:<28} tol {r['tol']:g}  other-input agrees "
              f"{r['other_input_agrees']!s:<5}  {scaled}  reparam differs "
              f"{r['reparam_differs']!s:<5} centred {r['centred']!s:<5} -> {r['probe']} "
              f"{r['scale'] or ''} {r.get('shift') or ''}", flush=True)
    if "--json" in sys.argv:
        print(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
