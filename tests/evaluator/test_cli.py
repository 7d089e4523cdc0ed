"""`kloop eval` and `kloop baseline`, run as a user would (a subprocess of the real CLI)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from eval_helpers import CANDIDATES, MLP_SMALL
from kloop.evaluator.common.result import EvalResult

REPO = Path(__file__).resolve().parents[2]
SIZES = [arg for k, v in MLP_SMALL.items() for arg in ("--set", f"{k}={json.dumps(v)}")]


def kloop(*args: str, cache_dir: Path) -> subprocess.CompletedProcess:
    env = dict(os.environ, KLOOP_CACHE_DIR=str(cache_dir))
    return subprocess.run([sys.executable, "-c", "from agent.cli import main; main()", *args],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=600)


def test_eval_json_prints_exactly_one_eval_result(cache_dir):
    p = kloop("eval", str(CANDIDATES / "mlp_torch.py"), "--problem", "L3/1", "--device", "cpu",
              "--json", *SIZES, cache_dir=cache_dir)
    assert p.returncode == 0, p.stderr
    assert len(p.stdout.strip().splitlines()) == 1
    result = EvalResult.model_validate_json(p.stdout)
    assert (result.status, result.problem_id, result.policy) == ("correct", "L3/1", "strict")
    assert result.problem_overrides == MLP_SMALL
    assert json.loads(result.model_dump_json()) == json.loads(p.stdout)


def test_eval_summary_and_errors(cache_dir):
    p = kloop("eval", str(CANDIDATES / "raises.py"), "--problem", "L3/1", "--device", "cpu",
              *SIZES, cache_dir=cache_dir)
    assert p.returncode == 1, p.stderr  # a verdict other than correct
    assert "runtime_error" in p.stdout and "candidate gave up" in p.stdout

    bad = kloop("eval", str(CANDIDATES / "mlp_torch.py"), "--problem", "L3/1", "--policy",
                "lenient", cache_dir=cache_dir)
    assert bad.returncode == 2
    assert "unknown policy 'lenient'" in bad.stderr and "kernelbench, strict" in bad.stderr


def test_baseline_times_and_caches_the_reference(cache_dir):
    args = ("baseline", "--problem", "L3/1", "--device", "cpu", *SIZES)
    first = kloop(*args, cache_dir=cache_dir)
    assert first.returncode == 0, first.stderr
    assert "L3/1" in first.stdout
    records = list((cache_dir / "private" / "baselines").glob("*.json"))
    assert records
    assert any(json.loads(r.read_text())["eager"]["clock"] == "harness" for r in records)


def test_small_sizes_on_a_gpu_come_with_a_warning_and_never_on_cpu(monkeypatch):
    import torch
    from kloop.evaluator.tools.cli import small_on_gpu

    assert small_on_gpu("small", "cpu") is None
    assert small_on_gpu("full", "cuda") is None
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    warning = small_on_gpu("small", "auto")
    assert warning is not None and "below_clock_resolution" in warning
    assert small_on_gpu(None, "cuda") is None
