"""A candidate's time under kloop's `kernelbench` policy beside KernelBench's own eval of the same
file, in one device call.

KernelBench is not part of kloop: its repository is fetched into a git-ignored folder (`.kb/`,
holding its `src/kernelbench` and `KernelBench/level3`) and carried to the device. Its
`eval_kernel_against_ref` runs in a process of its own per candidate, on KernelBench's own
reference file; its LLM-client imports (openai, litellm, dotenv), which the eval never calls, are
given empty modules there, since the GPU host cannot install them. Nothing of it enters kloop.

    python bench/kb_agreement.py --kb .kb --problems L3/4,L3/11,L3/20 --json out.jsonl

Each candidate is the problem's own reference as `ModelNew` (the same file for both harnesses)
unless `--candidate PROBLEM=PATH` names one. Prints KernelBench's mean (100 trials, CUDA events)
and kloop's (`kernelbench` policy: mean of 100 L2-flushed calls, bounded events) and their
ratio.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT)]

from kloop.evaluator.common.config import EvalConfig  # noqa: E402
from kloop.evaluator.harness.pipeline import evaluate  # noqa: E402
from kloop.problems.registry import get_problem, reference_as_candidate  # noqa: E402

KB_RUNNER = textwrap.dedent('''
    import json, sys, types
    for name in ("dotenv", "openai", "litellm"):
        m = types.ModuleType(name)
        m.load_dotenv = lambda *a, **k: None
        m.OpenAI = object
        m.completion = None
        sys.modules[name] = m
    sys.path.insert(0, sys.argv[1])
    from kernelbench.eval import eval_kernel_against_ref
    ref = open(sys.argv[2]).read()
    cand = open(sys.argv[3]).read()
    r = eval_kernel_against_ref(ref, cand, num_correct_trials=5, num_perf_trials=100,
                                measure_performance=True, timing_method="cuda_event",
                                backend=sys.argv[4], build_dir=sys.argv[5])
    print("KBRESULT " + json.dumps({"correct": bool(r.correctness), "runtime_ms": r.runtime,
                                    "ref_runtime_ms": getattr(r, "ref_runtime", None),
                                    "stats": r.runtime_stats}))
''')


def kb_eval(kb: Path, ref: Path, cand: Path, backend: str) -> dict:
    with tempfile.TemporaryDirectory() as build:
        p = subprocess.run([sys.executable, "-c", KB_RUNNER, str(kb / "src"), str(ref),
                            str(cand), backend, build], capture_output=True, text=True,
                           timeout=600)
    line = next((x for x in p.stdout.splitlines() if x.startswith("KBRESULT ")), None)
    if line is None:
        return {"error": (p.stderr or p.stdout)[-800:]}
    return json.loads(line[len("KBRESULT "):])


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--kb", default=".kb")
    ap.add_argument("--problems", default="L3/4,L3/11,L3/20")
    ap.add_argument("--candidate", action="append", default=[],
                    help="PROBLEM=PATH: judge this file instead of the reference as ModelNew")
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    kb = Path(a.kb).resolve()
    chosen = dict(c.split("=", 1) for c in a.candidate)
    out = open(a.json, "w") if a.json else None
    for pid in a.problems.split(","):
        problem = get_problem(pid)
        kb_ref = kb / "KernelBench" / "level3" / problem.path.name
        source = Path(chosen[pid]).read_text() if pid in chosen else \
            reference_as_candidate(problem.path.read_text())
        backend = "triton" if "triton" in source else "cuda"
        with tempfile.NamedTemporaryFile("w", suffix=".py", delete=False) as f:
            f.write(source)
        theirs = kb_eval(kb, kb_ref, Path(f.name), backend)
        r = evaluate(problem, source, EvalConfig(device="cuda", policy="kernelbench",
                                                 baselines="eager"))
        ours = r.timing.mean_ms if r.timing else None
        ev = r.timing.events.mean_ms if r.timing and r.timing.events else None
        row = {"problem": pid, "kloop_status": r.status, "kloop_mean_ms": ours,
               "kloop_events_mean_ms": ev, "kloop_clock": r.speedup_clock, "kb": theirs}
        kb_ms = theirs.get("runtime_ms")
        ratio = (ev or ours) / kb_ms if kb_ms and (ev or ours) else None
        row["ratio_kloop_over_kb"] = ratio
        print(f"{pid}: kloop {r.status} mean {ours} ms (events {ev}) | KernelBench "
              f"{'correct' if theirs.get('correct') else theirs.get('error', 'incorrect')[:200]} "
              f"{kb_ms} ms | ratio {ratio}", flush=True)
        if out:
            out.write(json.dumps(row) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
