"""bench/acceptance.py reads the four throughput figures from the benchmarks' JSON and meets a target
only with a figure measured: a missing step, a failed candidate or a slow build is not met."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
# Loaded from its path: bench/ on sys.path would put bench/evaluator.py before the package.
_spec = importlib.util.spec_from_file_location("acceptance", REPO / "bench" / "acceptance.py")
acceptance = sys.modules.setdefault("acceptance", importlib.util.module_from_spec(_spec))
_spec.loader.exec_module(acceptance)


def _figures(tmp: Path, *, per_hour=873.0, busy=0.62, build_p50=9.8, e2e=4.2,
             status="correct") -> tuple[Path, Path, Path]:
    throughput = tmp / "throughput.json"
    throughput.write_text(json.dumps({
        "baseline": {"per_hour": 176.0, "busy": 0.06, "wall_s": 600.0},
        "this checkout": {"per_hour": per_hour, "busy": busy, "wall_s": 123.8}}))
    builds = tmp / "builds.json"
    builds.write_text(json.dumps({"compile": {
        "torch .cu": {"plain_p50": 62.3, "kloop_p50": 41.2, "plain_p90": 63.0,
                      "kloop_p90": 42.0, "files": 3, "lean_cuda": True},
        "torch-free .cu": {"plain_p50": 30.7, "kloop_p50": build_p50, "plain_p90": 31.0,
                           "kloop_p90": build_p50 + 0.2, "files": 3, "lean_cuda": True}}}))
    stages = tmp / "stages.json"
    row = {"problem": "L3/4", "candidate": "lenet_cuda_relu.py", "stages": {}}
    stages.write_text(json.dumps({"stages": [
        {**row, "cache": "cold", "status": "correct", "total_s": 40.0},
        {**row, "cache": "warm", "status": "correct", "total_s": 4.0},
        {**row, "cache": "warm", "status": status, "total_s": e2e}]}))
    return throughput, builds, stages


def _run(throughput: Path, *evaluator: Path) -> tuple[int, str]:
    p = subprocess.run([sys.executable, str(REPO / "bench" / "acceptance.py"),
                        "--throughput", str(throughput),
                        *[a for e in evaluator for a in ("--evaluator", str(e))]],
                       capture_output=True, text=True, cwd=REPO, timeout=60)
    return p.returncode, p.stdout


def test_every_target_met_exits_zero_and_reads_the_checkout_not_the_baseline(tmp_path):
    rc, out = _run(*_figures(tmp_path))
    assert rc == 0, out
    assert "throughput targets: all met" in out
    assert "873.00" in out and "176" not in out  # the baseline pass is the comparison only
    assert "plain load_inline 30.7 s" in out  # the prompted form's build, beside plain


@pytest.mark.parametrize("change, figure", [
    ({"per_hour": 599.0}, "candidates per GPU-hour"),
    ({"busy": 0.49}, "GPU busy"),
    ({"build_p50": 15.1}, "cold CUDA build p50"),
    ({"e2e": 5.2}, "cached L3/4 candidate end to end"),
])
def test_a_figure_past_its_target_is_not_met(tmp_path, change, figure):
    rc, out = _run(*_figures(tmp_path, **change))
    assert rc == 1, out
    line = next(li for li in out.splitlines() if li.startswith(figure))
    assert "  NO" in line, line
    assert sum("  yes" in li for li in out.splitlines()) == 3, out


def test_the_cached_run_counts_only_when_it_was_judged_correct(tmp_path):
    rc, out = _run(*_figures(tmp_path, e2e=1.0, status="runtime_error"))
    assert rc == 1 and "judged runtime_error, not correct" in out, out


def test_a_step_that_left_no_figures_is_not_measured_and_not_met(tmp_path):
    throughput, builds, _ = _figures(tmp_path)
    rc, out = _run(throughput, builds, tmp_path / "stages.missing.json")
    assert rc == 1 and "not found:" in out and "stages.missing.json" in out, out
    line = next(li for li in out.splitlines() if li.startswith("cached L3/4"))
    assert " - " in line and "  NO" in line, line
    rc, out = _run(tmp_path / "no-throughput.json", builds)
    assert rc == 1 and out.count("  NO") == 3, out  # throughput, busy, and the cached run


def test_the_evaluator_bench_writes_the_figures_acceptance_reads(tmp_path):
    """bench/evaluator.py --json on CPU (numbers mean nothing; the shape is what the acceptance
    reads): the cv part's figures land in the file as the part finishes."""
    out = tmp_path / "cv.json"
    p = subprocess.run([sys.executable, str(REPO / "bench" / "evaluator.py"), "--device", "cpu",
                        "--only", "cv", "--cv-set", "smoke", "--repeats", "2", "--json", str(out)],
                       capture_output=True, text=True, cwd=REPO, timeout=600)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    cv = json.loads(out.read_text())["cv"]
    assert cv["set"] == "smoke" and cv["median_ms"] > 0 and cv["candidate"] >= 0
    merged = acceptance._merge([out])
    assert acceptance.rows(None, merged)[2].measured is None  # no compile part: not measured
