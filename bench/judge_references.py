"""Judge problems' own references as candidates, one at a time, and print each result's stage
seconds (where a full-size evaluation holds the device lock).

    python bench/judge_references.py cuda 'L3/8' 'L3/4:{"batch_size": 4}'

Each argument is a problem id, optionally `:` and its size overrides as JSON. The eager
baseline only (`baselines=eager`), so no torch.compile baseline is built.
"""
import sys, time, tempfile, json
from pathlib import Path
sys.path.insert(0,'.')
from evaluator.config import EvalConfig
from evaluator.fair_baseline import honest_source
from evaluator.pipeline import evaluate
from problems.registry import get_problem
dev = sys.argv[1]
for spec in sys.argv[2:]:
    pid, _, ov = spec.partition(":")
    t = time.monotonic()
    r = evaluate(pid, honest_source(get_problem(pid).path.read_text()), EvalConfig(device=dev, baselines="eager", problem_overrides=json.loads(ov or "{}")))
    print(pid, r.status, round(time.monotonic()-t,1), {k: round(v,2) for k,v in r.stage_seconds.items()}, r.flags[:4], flush=True)
