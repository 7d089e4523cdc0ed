"""The ncu pass's seconds are part of each evaluation's time (so of `eval_s`); a run that
collected hardware counters says how much of its evaluation time they took."""

from __future__ import annotations

from kloop.agent.report.build import run_report
from kloop.agent.report.load import load_run
from report_fixtures import T, write_run


def test_the_report_says_how_much_eval_time_ncu_took(tmp_path):
    path = write_run(tmp_path / "prof", ["L3/1", "L3/4"], [
        T("L3/1", eager=2.0, eval_s=20.0), T("L3/4", status="incorrect", eval_s=5.0),
        T("L3/4", eager=1.5, eval_s=15.0)], eval_fields={"ncu": True})
    run = load_run(path)
    correct = [t for t in run.turns if t.eval is not None and t.eval.status == "correct"]
    for t, seconds in zip(correct, (6.5, 4.0), strict=True):  # what `_ncu_pass` would record
        t.eval.stage_seconds["ncu"] = seconds
    warnings = run_report(run, n_boot=0, seed=0, scope="problem").warnings
    assert "ncu hardware counters: 10.5 s of the 40.0 eval s (2 evaluations)" in warnings

    plain = run_report(load_run(path), n_boot=0, seed=0, scope="problem").warnings
    assert not any(w.startswith("ncu") for w in plain)
