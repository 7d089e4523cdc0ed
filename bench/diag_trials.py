"""Does what the candidate process does before its timed calls slow them? (GPU machine)

    python bench/diag_trials.py [--only L3/1,L3/4] [--repeats 2] [--device cuda]

The same code (the reference as `ModelNew`) times 2-5 % slower by its own CUDA events in the
candidate process than in the reference worker (bench/clock.py on the H200, 2026-12-01,
771c910 to 6feb02e). The candidate process runs the correctness trials first (more forwards, perturbed copies of the model,
torch.save of outputs); the reference worker does not. Here each model is evaluated with the
trials and, in this bench only, with the candidate job's trial list emptied (the served calls
are still checked), alternating, `--repeats` times each (bench/same_code_ab.py prints the
candidate's own event median, the trusted median, the reference worker's event median and the
speedup). If the gap closes without trials, the trials are the cause. Diagnostic only: never
a way to judge a candidate.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "bench")]

import same_code_ab  # noqa: E402
from kloop.evaluator.harness import stages  # noqa: E402

_with_trials = stages.candidate_job


def _without_trials(run, ref, build_dir):
    job = _with_trials(run, ref, build_dir)
    return job.model_copy(update={"trials": []})


@contextlib.contextmanager
def _no_trials():
    """The candidate job's trial list emptied (this process only; served calls still checked)."""
    stages.candidate_job = _without_trials
    try:
        yield
    finally:
        stages.candidate_job = _with_trials


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", default="L3/1-b1024,L3/1,L3/4")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--cache-dir", type=Path, default=Path("/tmp/kloop-bench-trials"))
    args = ap.parse_args()
    same_code_ab.run({"trials": contextlib.nullcontext, "none": _no_trials},
                     args.only.split(","), args.repeats, args.device, args.cache_dir)
    return 0


if __name__ == "__main__":
    sys.exit(main())
