"""Judge problems' own references as candidates, one at a time, and print each result's stage
seconds (where a full-size evaluation holds the device lock).

    python bench/judge_references.py cuda 'L3/8' 'L3/4:{"batch_size": 4}'

Each argument after the device is a problem id, optionally `:` and its size overrides as JSON.
The eager baseline only (`baselines=eager`): no torch.compile baseline is built.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

sys.path[:0] = [str(Path(__file__).resolve().parents[1])]

from kloop.evaluator.common.config import EvalConfig  # noqa: E402
from kloop.evaluator.harness.pipeline import evaluate  # noqa: E402
from kloop.problems.registry import get_problem, reference_as_candidate  # noqa: E402


def main() -> int:
    device = sys.argv[1]
    for spec in sys.argv[2:]:
        pid, _, overrides = spec.partition(":")
        t = time.monotonic()
        r = evaluate(pid, reference_as_candidate(get_problem(pid).path.read_text()), EvalConfig(
            device=device, baselines="eager", problem_overrides=json.loads(overrides or "{}")))
        stages = {k: round(v, 2) for k, v in r.stage_seconds.items()}
        print(f"{pid} {overrides or 'full size'}: {r.status} in {time.monotonic() - t:.1f} s "
              f"{stages} {r.flags[:4]}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
