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
    return subprocess.run([sys.executable, "-c", "from kloop.agent.cli import main; main()", *args],
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


def test_baseline_warms_several_problems_at_once_and_a_failing_reference_is_a_row(
        cache_dir, tmp_path):
    """`kloop baseline --concurrency 2`: both problems timed, the one whose reference raises
    reported in its row (not the end of the warm-up), and the warm-up's wall time printed."""
    lenet = (REPO / "problems" / "level3" / "4_LeNet5.py").read_text()
    level = tmp_path / "kb" / "level1"
    level.mkdir(parents=True)
    (level / "1_LeNet.py").write_text(lenet)
    broken = lenet.replace("def forward(self, x):", "def forward(self, x):\n"
                           "        raise ValueError('reference breaks here')", 1)
    assert broken != lenet
    (level / "2_Broken.py").write_text(broken)
    p = kloop("baseline", "--level", "1", "--problems-dir", str(tmp_path / "kb"), "--device",
              "cpu", "--size", "small", "--concurrency", "2", cache_dir=cache_dir)
    assert p.returncode == 0, p.stderr
    rows = {line.split()[1]: line for line in p.stdout.splitlines() if "L1/" in line}
    assert set(rows) == {"L1/1", "L1/2"}, p.stdout
    assert "ValueError: reference breaks here" in rows["L1/2"], p.stdout
    assert "2 problems' baselines in" in p.stdout and "2 at once" in p.stdout
    assert "L1/2 (" in p.stderr and "failed in" in p.stderr
    eager = [json.loads(r.read_text()).get("eager") for r in
             (cache_dir / "private" / "baselines").glob("*.json")]
    assert any(e and e["clock"] == "harness" for e in eager)


def test_small_sizes_on_a_gpu_come_with_a_warning_and_never_on_cpu(monkeypatch):
    import torch

    from kloop.evaluator.tools.cli import small_on_gpu

    assert small_on_gpu("small", "cpu") is None
    assert small_on_gpu("full", "cuda") is None
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    warning = small_on_gpu("small", "auto")
    assert warning is not None and "below_clock_resolution" in warning
    assert small_on_gpu(None, "cuda") is None
