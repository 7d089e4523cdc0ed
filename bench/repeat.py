"""Does the same kernel get the same speedup? Fixed candidates judged several times each inside a
busy batch, paired speedups beside the unpaired ones of the same evaluations.

    python bench/repeat.py [--device cuda] [--concurrency 8] [--repeats 5]
                           [--problems L3/4,L3/11,L3/1,L3/5] [--kinds reference,triton,cuda_lean]
                           [--builds 4] [--size full|small] [--json F]

The candidates are bench/experiment.py's, made here for every problem and kind named: the
reference as a candidate, and the reference with its output passed through a Triton or a CUDA
copy kernel (three families). The default set holds L3/4 at full size (LeNet-5: launch-bound,
under a millisecond) and L3/11 (VGG-16, several milliseconds). Every repeat is one more copy of
each candidate in the same batch, `--concurrency` evaluations at once through the scheduler, with
`--builds` fresh CUDA builds (a `torch/extension.h` candidate whose source changes every time)
per repeat among them: what a busy run looks like.

Printed per candidate: the median of its own timed calls and each speedup over the repeats,
with their coefficient of variation (std / mean, in %), and the same for the unpaired speedup
of the same evaluations (the reference worker's first eager session, measured at another moment
of the evaluation: `EvalResult.paired.unpaired_eager_ms`, over the candidate's median): what the
speedup would have read without pairing. On CPU speedups are not measured (not comparable), so
only the medians' CV is printed.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
HERE = Path(__file__).resolve().parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != HERE]
sys.path[:0] = [str(REPO)]

DEFAULT_PROBLEMS = "L3/4,L3/11,L3/1,L3/5"
DEFAULT_KINDS = "reference,triton,cuda_lean"


def cv(values: list[float]) -> float | None:
    """Coefficient of variation in %; None with fewer than two values."""
    if len(values) < 2:
        return None
    mean = statistics.fmean(values)
    return statistics.stdev(values) / mean * 100.0 if mean else None


def figures(results: list) -> dict:
    """One candidate's repeats -> its medians, speedups and their CVs."""
    correct = [r for r in results if r.status == "correct" and r.timing is not None]
    medians = [r.timing.median_ms for r in correct]
    out: dict = {"repeats": len(results), "correct": len(correct),
                 "statuses": sorted({r.status for r in results}),
                 "median_ms": medians, "median_cv_pct": cv(medians)}
    for name in ("eager", "compile", "compile_ro"):
        vs = [getattr(r, f"speedup_vs_{name}") for r in correct]
        vs = [v for v in vs if v is not None]
        out[f"speedup_vs_{name}"] = vs
        out[f"speedup_vs_{name}_cv_pct"] = cv(vs)
    unpaired = [r.paired.unpaired_eager_ms / r.timing.median_ms for r in correct
                if r.paired is not None and r.paired.unpaired_eager_ms and r.timing.median_ms]
    out["unpaired_speedup_vs_eager"] = unpaired
    out["unpaired_speedup_vs_eager_cv_pct"] = cv(unpaired)
    out["intervals_vs_eager"] = [
        [r.speedup_ci["eager"].low, r.speedup_ci["eager"].high] for r in correct
        if "eager" in r.speedup_ci]
    return out


def _pct(v: float | None) -> str:
    return "-" if v is None else f"{v:.2f}"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--problems", default=DEFAULT_PROBLEMS)
    ap.add_argument("--kinds", default=DEFAULT_KINDS)
    ap.add_argument("--builds", type=int, default=4, help="fresh CUDA builds per repeat")
    ap.add_argument("--size", choices=("full", "small"), default="full")
    ap.add_argument("--cache", type=Path, help="the evaluator's cache (default: a fresh one)")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)
    import tempfile

    cache = args.cache or Path(tempfile.mkdtemp(prefix="kloop-repeat-"))
    sys.path[:0] = [str(HERE)]
    from experiment import batch

    from kloop.evaluator.common.config import EvalConfig
    from kloop.evaluator.procs.scheduler import Scheduler

    fixed = batch(args.problems.split(","), args.kinds.split(","), args.size)
    load = batch(args.problems.split(","), ["cuda_torch"], args.size) if args.builds else []
    plan: list[tuple[str | None, dict]] = []  # (label of a fixed candidate or None, item)
    for rep in range(args.repeats):
        plan += [(it["label"], it) for it in fixed]
        for k in range(args.builds):  # a fresh build each time: the source changes
            it = load[k % len(load)]
            plan.append((None, {**it, "source": it["source"] + f"\n# build {rep}.{k}\n"}))
    results: dict[str, list] = {it["label"]: [] for it in fixed}
    start = time.monotonic()
    with Scheduler(args.concurrency) as sched:
        futures = [(label, sched.submit(it["problem"], it["source"], EvalConfig(
            device=args.device, cache_dir=cache, problem_overrides=it["overrides"])))
                   for label, it in plan]
        for label, fut in futures:
            r = fut.result()
            if label is not None:
                results[label].append(r)
    wall = time.monotonic() - start
    table = {label: figures(rs) for label, rs in results.items()}
    print(f"== {len(plan)} evaluations ({len(fixed)} fixed candidates x {args.repeats}, "
          f"{args.builds} fresh CUDA builds per repeat) at {args.concurrency} at once on "
          f"{args.device}, {args.size} size, in {wall:.0f} s ==")
    print(f"{'candidate':28} {'ok':>5} {'median ms':>10} {'cv %':>6} {'vs eager':>9} {'cv %':>6} "
          f"{'unpaired':>9} {'cv %':>6} {'vs compile':>10} {'cv %':>6}")
    for label, f in table.items():
        med = statistics.median(f["median_ms"]) if f["median_ms"] else None
        sp = statistics.median(f["speedup_vs_eager"]) if f["speedup_vs_eager"] else None
        un = (statistics.median(f["unpaired_speedup_vs_eager"])
              if f["unpaired_speedup_vs_eager"] else None)
        co = statistics.median(f["speedup_vs_compile"]) if f["speedup_vs_compile"] else None
        print(f"{label:28} {f['correct']:>2}/{f['repeats']:<2} {_pct(med):>10} "
              f"{_pct(f['median_cv_pct']):>6} {_pct(sp):>9} {_pct(f['speedup_vs_eager_cv_pct']):>6} "
              f"{_pct(un):>9} {_pct(f['unpaired_speedup_vs_eager_cv_pct']):>6} {_pct(co):>10} "
              f"{_pct(f['speedup_vs_compile_cv_pct']):>6}")
    if args.json:
        args.json.write_text(json.dumps({
            "conditions": {"device": args.device, "concurrency": args.concurrency,
                           "repeats": args.repeats, "builds_per_repeat": args.builds,
                           "size": args.size, "wall_s": wall},
            "candidates": table}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
