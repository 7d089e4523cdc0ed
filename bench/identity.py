"""Each problem's own reference, submitted as the candidate, judged at full KernelBench size.

Identical code on both sides: every speedup should read 1.00, and its paired interval should
hold 1.00. Prints one row per evaluation and writes them as JSON lines; `--repeat k` judges each
problem k times (repeatability: the CV of the paired speedup beside the unpaired one, which
divides by the reference worker's own earlier session).

    python bench/identity.py --problems L3/1,L3/4 --repeat 3 --concurrency 4 --json out.jsonl
    python bench/identity.py --all --baselines eager --json out.jsonl
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path[:0] = [str(Path(__file__).resolve().parents[1])]

from kloop.evaluator.common.config import EvalConfig  # noqa: E402
from kloop.evaluator.harness.pipeline import evaluate_many  # noqa: E402
from kloop.problems.registry import get_problem, load_problem_set, reference_as_candidate  # noqa: E402


def row(pid: str, r, wall_s: float) -> dict:
    eager = r.eager.median_ms if r.eager else None
    cand = r.timing.median_ms if r.timing else None
    ci = r.speedup_ci.get("eager")
    unpaired = r.paired.unpaired_eager_ms if r.paired else None
    return {
        "problem": pid, "status": r.status, "speedup_vs_eager": r.speedup_vs_eager,
        "ci": [ci.low, ci.high] if ci else None, "eager_ms": eager, "candidate_ms": cand,
        "unpaired_speedup": unpaired / cand if unpaired and cand else None,
        "speedup_vs_compile": r.speedup_vs_compile,
        "compile_ms": r.compiled.median_ms if r.compiled else None,
        "handshake_ms": r.paired.handshake_ms if r.paired else None,
        "precision_calls": r.precision_calls, "flags": r.flags,
        "stage_seconds": r.stage_seconds, "wall_s": round(wall_s, 1),
        "error": r.error.message[:200] if r.error else None,
    }


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--problems", default="")
    ap.add_argument("--all", action="store_true")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--baselines", default="eager")
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--concurrency", type=int, default=4)
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    ids = [p.id for p in load_problem_set() if p.level == 3] if a.all else a.problems.split(",")
    jobs = [(pid, reference_as_candidate(get_problem(pid).path.read_text()))
            for pid in ids for _ in range(a.repeat)]
    cfg = EvalConfig(device=a.device, baselines=a.baselines)
    t0 = time.monotonic()
    results = evaluate_many(jobs, cfg, max_workers=a.concurrency)
    wall = time.monotonic() - t0
    rows = [row(pid, r, wall) for (pid, _), r in zip(jobs, results, strict=True)]
    out = open(a.json, "w") if a.json else None
    for x in rows:
        ci = f"[{x['ci'][0]:.3f}, {x['ci'][1]:.3f}]" if x["ci"] else "-"
        sp = f"{x['speedup_vs_eager']:.3f}" if x["speedup_vs_eager"] else "-"
        up = f"{x['unpaired_speedup']:.3f}" if x["unpaired_speedup"] else "-"
        print(f"{x['problem']:6} {x['status']:13} paired {sp} {ci} unpaired {up} "
              f"eager {x['eager_ms']} ms cand {x['candidate_ms']} ms "
              f"hold {x['stage_seconds'].get('candidate_held')} s "
              f"{[f for f in x['flags'] if not f.startswith('problem_')][:3]} {x['error'] or ''}",
              flush=True)
        if out:
            out.write(json.dumps(x) + "\n")
    by: dict[str, list[dict]] = {}
    for x in rows:
        by.setdefault(x["problem"], []).append(x)
    for pid, xs in by.items():
        for key in ("speedup_vs_eager", "unpaired_speedup"):
            v = [x[key] for x in xs if x[key]]
            if len(v) > 1:
                print(f"{pid} {key}: mean {statistics.mean(v):.3f} CV "
                      f"{100 * statistics.stdev(v) / statistics.mean(v):.2f} % over {len(v)}")
    ok = sum(x["status"] == "correct" for x in rows)
    print(f"{ok}/{len(rows)} correct; wall {wall:.0f} s; device {a.device}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
