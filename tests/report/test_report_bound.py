"""The speed-of-light fraction of best kernels in reports, against hand computation from the
datasheet peaks and the committed FLOP and byte counts."""

from __future__ import annotations

from pathlib import Path

import pytest
from kloop.agent.report.bound import PEAKS
from kloop.agent.report.build import build_report, write_report
from report_fixtures import T, write_run

H200, A100 = "NVIDIA H200", "NVIDIA A100-SXM4-80GB"
# L3/1 by hand: 128 x 16384 -> 16384 -> 16384 -> 8192 (fp32 on the device).
MLP_FLOPS = 2 * 128 * (16384 * 16384 * 2 + 16384 * 8192)
MLP_BYTES = 4 * (128 * 16384 + (16384 * 16384 + 16384) * 2 + 16384 * 8192 + 8192 + 128 * 8192)


def test_h200_kernels_show_their_fraction_and_others_a_dash(tmp_path):
    run = write_run(tmp_path / "gpu", ["L3/1", "L3/2", "L3/4", "L3/5"], [
        T("L3/1", eager=1.5, runtime_ms=4.0, gpu=H200),
        T("L3/2", eager=1.2, runtime_ms=10.0, gpu=A100),  # a GPU the peaks table lacks
        T("L3/4", eager=1.1, runtime_ms=2.0),  # no device recorded
        T("L3/5", eager=1.3, runtime_ms=2.0, gpu=H200, comparable=False),  # a host-clock timing
    ])
    report = build_report([run], n_boot=0)
    rows = {r.problem_id: r for r in report.runs[0].problems}
    # fp32: the CUDA-core peak, 67 TFLOP/s; L3/1 is compute bound there (2.56 ms vs 0.56 ms).
    sol = max(MLP_FLOPS / 67e12, MLP_BYTES / 4.8e12) * 1e3
    assert sol == pytest.approx(2.5641, rel=1e-4)
    assert rows["L3/1"].sol_ms == pytest.approx(sol) and rows["L3/1"].sol_fraction == pytest.approx(sol / 4.0)
    assert rows["L3/2"].gpu == A100 and rows["L3/2"].sol_fraction is None
    assert rows["L3/4"].sol_fraction is None and rows["L3/5"].sol_fraction is None
    assert report.peaks == [PEAKS[H200]] and report.unknown_gpus == [A100]

    md = Path(write_report(report, tmp_path / "rep").markdown).read_text()
    table = md.split("## Run gpu")[1]
    assert "| vs eager | vs compile | vs compile_ro | vs best | of SOL |" in table
    assert f"| 1.5x | - | - | 1.5x (eager) | {sol / 4.0:.2g} |" in table and f"{sol / 4.0:.2g}" == "0.64"
    for pid in ("L3/2", "L3/4", "L3/5"):
        line = next(x for x in table.splitlines() if x.startswith(f"| {pid} "))
        assert line.split(" | ")[7] == "-", line
    assert "## Speed of light" in md
    assert "| H200 SXM | NVIDIA H200 | 67 | 494.5 | 989.5 | 4.8 |" in md
    assert f"No peaks known for {A100}" in md


def test_half_precision_runs_use_the_tensor_core_peak_and_half_the_bytes(tmp_path):
    run = write_run(tmp_path / "bf16", ["L3/1"], [T("L3/1", eager=2.0, runtime_ms=0.5, gpu=H200)],
                    eval_fields={"precision": "bf16"})
    row = build_report([run], n_boot=0).runs[0].problems[0]
    # 989.5 TFLOP/s dense bf16: 0.17 ms of compute; 2-byte elements: 0.28 ms of memory traffic.
    sol = max(MLP_FLOPS / 989.5e12, MLP_BYTES / 2 / 4.8e12) * 1e3
    assert sol == pytest.approx(MLP_BYTES / 2 / 4.8e12 * 1e3)
    assert row.sol_ms == pytest.approx(sol) and row.sol_fraction == pytest.approx(sol / 0.5)


def test_no_gpu_no_speed_of_light_section(tmp_path):
    run = write_run(tmp_path / "plain", ["L3/1"], [T("L3/1", eager=2.0)])
    report = build_report([run], n_boot=0)
    assert report.peaks == [] and report.unknown_gpus == []
    md = Path(write_report(report, tmp_path / "rep").markdown).read_text()
    assert "## Speed of light" not in md and "| of SOL |" in md
