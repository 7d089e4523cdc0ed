"""Where a reference worker's shared hold goes, piece by piece, one problem at a time (GPU).

    python bench/diag_reference.py [--only L3/1,L3/18,L3/35] [--calls 20] [--json F]

An evaluation's reference worker (trusted, outputs only under a kept worker) holds the device
shared for 2-9 s per candidate at full sizes (part 1 on an H100, 2026-12-06, 839cfe5): readers
go together in gaps between timings, so that time is wall time no candidate is timed in. This
runs the same operations the worker runs under its hold (`evaluator.worker.reference_worker`),
alone, in one process, and prints the wall time of each: the model moved to the device, a
probe trial, a reparam model built and moved, a float64 copy and its forward, the served
calls' outputs (drawn inputs, eager forward, outputs to host). Diagnostic only.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO)]

import torch  # noqa: E402

from kloop.evaluator.common.protocol import ProblemSpec  # noqa: E402
from kloop.evaluator.worker import reference_worker as rw  # noqa: E402
from kloop.evaluator.worker.construct import (  # noqa: E402
    as_output_list,
    clone_all,
    construct,
    draw_inputs,
    draw_served_inputs,
    init_inputs,
    load_problem,
    noisy_model,
    sync,
)
from kloop.problems.registry import get_problem  # noqa: E402

DEVICE = "cuda"


def _clock(times: dict[str, float], name: str, fn):
    sync(DEVICE)
    t0 = time.perf_counter()
    out = fn()
    sync(DEVICE)
    times[name] = round(time.perf_counter() - t0, 4)
    return out


def diagnose(problem_id: str, calls: int) -> dict:
    p = get_problem(problem_id)
    spec = ProblemSpec(path=str(p.path), sha256=p.sha256, device=DEVICE, precision="fp32",
                       allow_tf32=False, construction_seed=12345)
    cpu = spec.model_copy(update={"device": "cpu"})
    t: dict[str, float] = {}
    problem = load_problem(spec)
    init = init_inputs(problem, cpu)
    torch.set_num_threads(rw.PREPARE_THREADS)
    model = _clock(t, "construct_cpu_1thread (before the hold)",
                   lambda: construct(problem.Model, init, cpu))
    second = _clock(t, "reparam_construct_cpu (before the hold)",
                    lambda: noisy_model(problem.Model, init, cpu, 777))
    torch.set_num_threads(16)
    _clock(t, "cuda_init", lambda: torch.zeros(1, device=DEVICE))
    model = _clock(t, "move_model", lambda: model.to(device=DEVICE))
    second = _clock(t, "move_reparam", lambda: second.to(device=DEVICE))
    x = draw_inputs(problem, 1, cpu)
    x = _clock(t, "move_trial_inputs", lambda: [v.to(DEVICE) if isinstance(v, torch.Tensor) else v
                                                for v in x])
    with torch.no_grad():
        _clock(t, "first_forward", lambda: model(*clone_all(x)))
        out = _clock(t, "second_forward", lambda: model(*clone_all(x)))
        _clock(t, "trial_output_to_host", lambda: [o.cpu() for o in as_output_list(out)])
        _clock(t, "reparam_forward", lambda: second(*clone_all(x)))
        second = None  # freed before the float64 copy
        m64 = _clock(t, "float64_copy", lambda: rw.float64_copy(model))
        x64 = [v.double() if isinstance(v, torch.Tensor) and v.is_floating_point() else v
               for v in x]
        with rw._Float64Draws():
            _clock(t, "fp64_forward_first", lambda: m64(*x64))
            _clock(t, "fp64_forward_again", lambda: m64(*x64))
        m64 = None

        def served():
            for s in range(calls):
                o = model(*draw_served_inputs(problem, 1000 + s, spec))
                [v.cpu() for v in as_output_list(o)]
        _clock(t, f"served_outputs_x{calls}", served)
    t["params_gib"] = round(sum(q.numel() * 4 for q in model.parameters()) / 2**30, 3)
    return {"problem": problem_id, "gpu": torch.cuda.get_device_name() if DEVICE == "cuda" else "cpu",
            "seconds": t}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", default="L3/1,L3/18,L3/35")
    ap.add_argument("--calls", type=int, default=20)
    ap.add_argument("--json", type=Path)
    ap.add_argument("--device", default="cuda", help="cpu: a smoke run of this script only")
    args = ap.parse_args()
    global DEVICE
    DEVICE = args.device
    rows = []
    for pid in args.only.split(","):
        try:
            row = diagnose(pid, args.calls)
        except Exception as e:  # one problem's failure is a row, not the end
            row = {"problem": pid, "error": f"{type(e).__name__}: {str(e)[:300]}"}
        rows.append(row)
        print(json.dumps(row), flush=True)
        if DEVICE == "cuda":
            torch.cuda.empty_cache()
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
