"""A run judged on two GPU models (a mixed Ray cluster): its report keeps each model's metrics
apart, and says why."""

from __future__ import annotations

from pathlib import Path

import pytest
from kloop.agent.report.build import build_report, write_report
from report_fixtures import T, write_run

H200, H100 = "NVIDIA H200", "NVIDIA H100 80GB HBM3"


def test_metrics_are_grouped_by_the_gpu_each_problem_was_judged_on(tmp_path):
    run = write_run(tmp_path / "mixed", ["L3/1", "L3/2", "L3/4", "L3/5"], [
        T("L3/1", eager=2.0, gpu=H200), T("L3/2", status="incorrect", gpu=H200),
        T("L3/4", eager=0.5, gpu=H100), T("L3/5", eager=3.0, gpu=H100),
        T("L3/5", eager=4.0, runtime_ms=0.5, gpu=H100),
    ])
    report = build_report([run], n_boot=0).runs[0]
    rows = {r.problem_id: r.hardware for r in report.problems}
    assert rows == {"L3/1": H200, "L3/2": H200, "L3/4": H100, "L3/5": H100}
    assert set(report.by_hardware) == {H200, H100}
    h200, h100 = report.by_hardware[H200], report.by_hardware[H100]
    # fast_1.0 over each model's own problems: L3/1 of {L3/1, L3/2}; L3/5 of {L3/4, L3/5}.
    assert h200.problems == 2 and h200.fast_p[3].vs_eager.value == 0.5
    assert h100.problems == 2 and h100.fast_p[3].vs_eager.value == 0.5
    assert h100.geomean_vs_eager.value == pytest.approx((0.5 * 4.0) ** 0.5)
    assert any("judged on 2 GPU models" in w for w in report.warnings)
    md = Path(write_report(build_report([run], n_boot=0), tmp_path / "rep").markdown).read_text()
    section = md.split("## By hardware")[1]
    assert f"| mixed on {H200} | 2 | 1/2 |" in section and f"| mixed on {H100} | 2 | 2/2 |" in section


def test_a_run_on_one_gpu_model_has_no_hardware_section(tmp_path):
    run = write_run(tmp_path / "one", ["L3/1", "L3/4"], [
        T("L3/1", eager=2.0, gpu=H200), T("L3/4", eager=0.5, gpu=H200)])
    report = build_report([run], n_boot=0)
    assert report.runs[0].by_hardware == {}
    assert all(r.hardware == H200 for r in report.runs[0].problems)
    md = Path(write_report(report, tmp_path / "rep").markdown).read_text()
    assert "## By hardware" not in md


def test_the_harness_clock_on_a_gpu_is_not_called_a_host_clock(tmp_path):
    """Strict GPU runs are timed by the trusted harness clock, comparable GPU numbers: the
    report warned that they were host-clock timings (it checked for CUDA events only)."""
    from kloop.agent.report.load import provenance_warnings
    from kloop.agent.store import RunStore

    gpu = write_run(tmp_path / "gpu", ["L3/1"], [T("L3/1", eager=2.0, gpu=H200)])
    store = RunStore.open(gpu)
    turns = [t.model_copy(update={"eval": t.eval.model_copy(update={
        "timing": t.eval.timing.model_copy(update={"clock": "harness"})})}) for t in store.turns()]
    assert not any("host clock" in w for w in provenance_warnings(store.config_record(), turns))
    cpu = write_run(tmp_path / "cpu", ["L3/1"], [T("L3/1", eager=2.0, comparable=False)])
    store = RunStore.open(cpu)
    assert any("on cpu with a host clock" in w
               for w in provenance_warnings(store.config_record(), store.turns()))
