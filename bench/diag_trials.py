"""Does what the candidate process does before its timed calls slow them? (GPU machine)

    python bench/diag_trials.py [--only L3/1,L3/4] [--repeats 2] [--device cuda]

The same code (the reference as `ModelNew`) times 2-5 % slower by its own CUDA events in the
candidate process than in the reference worker (GPU_VALIDATION.md, sessions 4-6). The candidate
process runs the correctness trials first (more forwards, perturbed copies of the model,
torch.save of outputs); the reference worker does not. Here each model is evaluated with the
trials and, in this bench only, with the candidate job's trial list emptied (the served calls
are still checked), alternating, `--repeats` times each. Printed per run: the candidate's own
event median and raw harness median, the eager baseline's (reference worker) event median, and
the speedup. If the gap closes without trials, the trials are the cause. Diagnostic only: never
a way to judge a candidate.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "bench")]

from clock import MODELS, honest_source  # noqa: E402

from evaluator import stages  # noqa: E402
from evaluator.config import EvalConfig  # noqa: E402
from evaluator.pipeline import evaluate  # noqa: E402

_with_trials = stages.candidate_job


def _without_trials(run, ref, build_dir):
    job = _with_trials(run, ref, build_dir)
    return job.model_copy(update={"trials": []})


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", default="L3/1-b1024,L3/1,L3/4")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--cache-dir", type=Path, default=Path("/tmp/kloop-bench-trials"))
    args = ap.parse_args()
    wanted = args.only.split(",")
    print(f"{'model':<12} {'trials':>6} {'cand ev':>8} {'cand raw':>9} {'ref ev':>8} "
          f"{'cand/ref ev':>11} {'speedup':>8}", flush=True)
    for label, pid, overrides in MODELS:
        if label not in wanted:
            continue
        cfg = EvalConfig(device=args.device, baselines="eager", profile=False,
                         cache_dir=args.cache_dir, problem_overrides=overrides)
        ratios: dict[str, list[float]] = {"yes": [], "no": []}
        for _ in range(args.repeats):
            for mode, job in (("yes", _with_trials), ("no", _without_trials)):
                stages.candidate_job = job
                try:
                    r = evaluate(pid, honest_source(pid), cfg)
                finally:
                    stages.candidate_job = _with_trials
                t, e = r.timing, r.eager
                if r.status != "correct" or t is None or e is None:
                    print(f"{label:<12} {mode:>6} {r.status}: {r.error}", flush=True)
                    continue
                cand, ref = t.worker_event_median_ms, e.worker_event_median_ms
                ratio = cand / ref if cand and ref else float("nan")
                ratios[mode].append(ratio)
                print(f"{label:<12} {mode:>6} {cand or 0:>8.4f} {t.raw_median_ms or 0:>9.4f} "
                      f"{ref or 0:>8.4f} {ratio:>11.3f} {r.speedup_vs_eager or 0:>8.3f}",
                      flush=True)
        for mode, vals in ratios.items():
            if vals:
                print(f"{label:<12} {mode:>6} median cand/ref events {statistics.median(vals):.3f}",
                      flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
