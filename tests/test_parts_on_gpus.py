"""scripts/parts_on_gpus.sh: parts of the figure of record at once on a multi-GPU host, one per
GPU, each with a cache of its own; any part's failure fails the step. The bench each part runs
is tested in tests/evaluator/test_bench_experiment.py; here a stand-in interpreter records what
the script asked of it."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "scripts" / "parts_on_gpus.sh"

# Says what it was asked (the GPU it sees and its arguments); part 3/9 fails.
STAND_IN = """#!/usr/bin/env bash
echo "gpu=$CUDA_VISIBLE_DEVICES args=$*"
case "$*" in *"--part 3/9"*) exit 3 ;; esac
"""


def run(tmp_path: Path, parts: str, gpus: int) -> subprocess.CompletedProcess:
    py = tmp_path / "py"
    py.write_text(STAND_IN)
    py.chmod(0o755)
    out = tmp_path / "out"
    out.mkdir(exist_ok=True)
    env = {**os.environ, "OUT": str(out), "EXPERIMENT_PARTS": parts, "PARTS_GPUS": str(gpus),
           "PARTS_PYTHON": str(py)}
    env.pop("EXPERIMENT_ARGS", None)
    return subprocess.run(["bash", str(SCRIPT)], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=60)


def test_each_part_gets_a_gpu_and_a_fresh_cache_of_its_own(tmp_path):
    stale = tmp_path / ".bench-parts" / "2of9" / "left-over"
    stale.parent.mkdir(parents=True)
    stale.write_text("from an earlier call")
    p = run(tmp_path, "1/9 2/9", gpus=2)
    assert p.returncode == 0, p.stderr
    assert p.stdout.splitlines() == ["part 1/9 rc=0", "part 2/9 rc=0"]
    for gpu, tag in ((0, "1of9"), (1, "2of9")):
        said = (tmp_path / "out" / f"experiment-{tag}.log").read_text().split()
        assert said[0] == f"gpu={gpu}"
        args = said[1:]
        assert args[args.index("--cache") + 1] == f".bench-parts/{tag}"
        assert args[args.index("--host-parts") + 1] == "2"
        assert args[args.index("--json") + 1] == str(tmp_path / "out" / f"experiment-{tag}.json")
        assert "--steady" in args  # the default pass: first use, then steady
    assert not stale.exists()  # every part starts on an empty cache


def test_a_failing_part_fails_the_step_and_more_parts_than_gpus_run_none(tmp_path):
    p = run(tmp_path, "2/9 3/9", gpus=2)
    assert p.returncode == 1
    assert p.stdout.splitlines() == ["part 2/9 rc=0", "part 3/9 rc=3"]
    p = run(tmp_path, "4/9 5/9 6/9", gpus=2)
    assert p.returncode == 2 and "3 parts for 2 GPUs" in p.stderr
    assert not (tmp_path / "out" / "experiment-4of9.log").exists()
