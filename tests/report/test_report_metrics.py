"""Metrics from synthetic run directories, checked against values computed by hand."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from kloop.agent.report.build import build_report, write_report
from kloop.agent.report.load import load_run
from kloop.agent.report.metrics import compute_metrics, count, problem_rows
from report_fixtures import T, write_run

# L3/3 is degenerate at 1e-4 (the strict policy's fp32 tolerance); L3/5 only from 1e-2.
PROBLEMS = ["L3/1", "L3/2", "L3/3", "L3/4", "L3/5"]
TURNS = [
    T("L3/1", "compile_error"),
    T("L3/1", "correct", eager=2.0, compile=1.5, runtime_ms=1.0),
    T("L3/1", "correct", eager=1.6, compile=1.2, runtime_ms=1.25),  # slower: not the best
    T("L3/2", "correct", eager=1.0, compile=0.8, runtime_ms=2.0, flags=("excessive_speedup",)),
    T("L3/3", "correct", eager=4.0, compile=3.0),
    T("L3/4", "incorrect"),
    T("L3/4", "rejected", rule="output_cache"),
    T("L3/4", "format_error", fault=True),
    # L3/5: no record at all
]


@pytest.fixture
def mixed(tmp_path):
    return load_run(write_run(tmp_path / "mixed", PROBLEMS, TURNS))


def test_fast_p_and_speedups_match_hand_computation(mixed):
    rows = problem_rows(mixed)
    assert [r.status for r in rows] == ["correct", "correct", "correct", "incorrect", "missing"]
    assert [r.degenerate for r in rows] == [False, False, True, False, False]
    assert (rows[0].best_episode, rows[0].best_turn, rows[0].speedup_vs_eager) == (0, 2, 2.0)
    m = compute_metrics([rows], n_boot=0)
    assert (m.problems, m.correct, m.correctness.value) == (5, 3, 0.6)
    # vs eager, best speedups 2.0, 1.0 (a tie: not above 1.0), 4.0 over 5 problems.
    assert [m.fast(p) for p in (0.0, 0.5, 0.8, 1.0, 1.5, 2.0)] == [0.6, 0.6, 0.6, 0.4, 0.4, 0.2]
    # vs compile: 1.5, 0.8 (not above 0.8), 3.0.
    assert [m.fast(p, "compile") for p in (0.0, 0.5, 0.8, 1.0, 1.5, 2.0)] == [0.6, 0.6, 0.4, 0.4, 0.2, 0.2]
    assert m.geomean_vs_eager.value == pytest.approx(2.0)  # (2 * 1 * 4) ** (1/3)
    assert m.geomean_vs_compile.value == pytest.approx(3.6 ** (1 / 3))
    assert (m.median_vs_eager.value, m.median_vs_compile.value) == (2.0, 1.5)
    assert m.faster_than_compile.value == pytest.approx(2 / 3)
    assert m.custom_share_mean == pytest.approx(0.9)
    assert (m.missing, m.not_run, m.correct_untimed) == (1, 0, 0)


def test_degenerate_problems_excluded(mixed):
    m = compute_metrics([problem_rows(mixed)], n_boot=0, exclude_degenerate=True)
    assert (m.problems, m.correct) == (4, 2)
    assert m.fast(1.0) == 0.25
    assert m.geomean_vs_eager.value == pytest.approx(math.sqrt(2.0))


def test_tolerance_decides_which_problems_are_degenerate(tmp_path):
    half = load_run(write_run(tmp_path / "fp16", PROBLEMS, TURNS[:2], eval_fields={"precision": "fp16"}))
    assert half.tolerance == 1e-2
    assert [p.id for p in half.problems if p.degenerate] == ["L3/3", "L3/5"]


def test_counts_of_verdicts_flags_and_rules(mixed):
    c = count(mixed, problem_rows(mixed))
    assert c.statuses == {"correct": 4, "compile_error": 1, "format_error": 1, "incorrect": 1, "rejected": 1}
    assert c.rejections == {"output_cache": 1}
    assert c.flags == {"excessive_speedup": 1} == c.flags_in_best
    assert c.faults == {"NoKernelFound": 1}
    assert c.stop_reasons == {"max_turns": 4}


def test_all_failed_run(tmp_path):
    run = load_run(write_run(tmp_path / "bad", ["L3/1", "L3/2"], [T("L3/1", "incorrect"), T("L3/2", "timeout")]))
    m = compute_metrics([problem_rows(run)], n_boot=200)
    assert m.correct == 0 and m.correctness.value == 0.0
    assert all(f.vs_eager.value == 0.0 and f.vs_compile.value == 0.0 for f in m.fast_p)
    assert m.geomean_vs_eager.value is None and m.median_vs_eager.value is None
    assert m.faster_than_compile.value is None


def test_bootstrap_is_seeded_and_brackets_the_estimate(mixed):
    rows = problem_rows(mixed)
    a = compute_metrics([rows], n_boot=500, seed=3)
    assert a == compute_metrics([rows], n_boot=500, seed=3)
    for est in (a.correctness, a.fast_p[3].vs_eager, a.geomean_vs_eager):
        assert est.lo <= est.value <= est.hi
    # Resampling 5 problems with 3 correct is Binomial(5, 0.6) / 5: its 2.5% and 97.5% points.
    assert (a.correctness.lo, a.correctness.hi) == (0.2, 1.0)
    assert compute_metrics([rows], n_boot=0).correctness.lo is None


def test_seed_group_averages_over_seeds(tmp_path):
    write_run(tmp_path / "runs" / "s0", ["L3/1", "L3/2"],
              [T("L3/1", eager=2.0), T("L3/2", "incorrect")], seed=0)
    write_run(tmp_path / "runs" / "s1", ["L3/1", "L3/2"],
              [T("L3/1", eager=9.0), T("L3/2", eager=1.0)], seed=1)
    report = build_report([tmp_path / "runs"], n_boot=300)
    assert [r.label for r in report.runs] == ["s0", "s1"]
    [group] = report.seed_groups
    assert group.seeds == [0, 1]
    m = group.metrics
    assert (m.seeds, m.correct) == (2, 1.5)
    assert m.correctness.value == pytest.approx(0.75)
    assert m.fast(1.0) == pytest.approx(0.5)
    assert m.geomean_vs_eager.value == pytest.approx((2.0 + 3.0) / 2)  # per-seed geomeans 2 and 3
    assert m.correctness.lo <= 0.75 <= m.correctness.hi


def test_host_clock_and_missing_timing_are_reported(tmp_path):
    run = load_run(write_run(tmp_path / "cpu", ["L3/1", "L3/2"],
                             [T("L3/1", eager=1.5, comparable=False), T("L3/2", eager=None)]))
    report = build_report([run.path], n_boot=0)
    r = report.runs[0]
    assert r.metrics.correct == 2 and r.metrics.fast(0.0) == 1.0 and r.metrics.fast(1.0) == 0.5
    assert any("host clock" in w for w in r.warnings)
    assert any("without a speedup" in w for w in r.warnings)


def test_a_cpu_run_is_ranked_by_cpu_time_labelled_not_comparable(tmp_path):
    """On CPU the evaluator records no speedup; the report ranks by the ratio of CPU times
    instead of calling every problem slow, and says those numbers are not GPU numbers."""
    run = load_run(write_run(tmp_path / "cpu", ["L3/1", "L3/2"], [
        T("L3/1", eager=4.0, runtime_ms=41.0, comparable=False),
        T("L3/2", eager=0.2, runtime_ms=205.0, comparable=False)]))
    assert all(t.eval.speedup_vs_eager is None for t in run.turns)
    rows = problem_rows(run)
    assert [r.speedup_vs_eager for r in rows] == pytest.approx([4.0, 0.2])
    assert [r.comparable for r in rows] == [False, False]
    r = build_report([run.path], n_boot=0).runs[0]
    assert r.metrics.fast(1.0) == 0.5 and r.metrics.geomean_vs_eager.value == pytest.approx(0.8 ** 0.5)
    assert any("ratios of CPU times vs eager, not comparable with GPU numbers" in w for w in r.warnings)


def test_fast_p_against_each_baseline_and_the_fastest(tmp_path):
    run = write_run(tmp_path / "three", ["L3/1", "L3/2", "L3/4", "L3/5"], [
        T("L3/1", eager=3.0, compile=2.0, compile_ro=1.25),  # reduce-overhead is the fastest
        T("L3/2", eager=1.2, compile=0.9),  # reduce-overhead failed: compile is
        T("L3/4", eager=2.0, compile=1.6, best_recorded=False),  # judged before the best was kept
        T("L3/5", "incorrect"),
    ])
    rows = problem_rows(load_run(run))
    assert [(r.best_baseline, r.speedup_vs_best) for r in rows] == [
        ("compile_ro", 1.25), ("compile", 0.9), ("compile", 1.6), (None, None)]
    assert [r.speedup_vs_compile_ro for r in rows] == [1.25, None, None, None]
    m = compute_metrics([rows], n_boot=0)
    ps = (0.0, 0.5, 0.8, 1.0, 1.5, 2.0)
    assert [m.fast(p) for p in ps] == [0.75, 0.75, 0.75, 0.75, 0.5, 0.25]
    assert [m.fast(p, "compile") for p in ps] == [0.75, 0.75, 0.75, 0.5, 0.5, 0.0]
    # Without a reduce-overhead speedup a correct kernel counts at p = 0 only.
    assert [m.fast(p, "compile_ro") for p in ps] == [0.75, 0.25, 0.25, 0.25, 0.0, 0.0]
    # The best: 1.25, 0.9, 1.6; never above any single baseline's fast_p.
    assert [m.fast(p, "best") for p in ps] == [0.75, 0.75, 0.75, 0.5, 0.25, 0.0]
    assert all(m.fast(p, "best") <= min(m.fast(p, vs) for vs in ("eager", "compile")) for p in ps)
    assert m.geomean_vs_best.value == pytest.approx((1.25 * 0.9 * 1.6) ** (1 / 3))
    assert m.geomean_vs_compile_ro.value == pytest.approx(1.25)
    assert m.correct_no_compile_ro == 2

    report = build_report([run], n_boot=0)
    assert any("2 correct kernel(s) without a torch.compile reduce-overhead" in w
               for w in report.runs[0].warnings)
    md = Path(write_report(report, tmp_path / "rep").markdown).read_text()
    assert "| fast_1.0 eager | fast_1.0 compile | fast_1.0 best |" in md
    assert "| three | compile reduce-overhead | 0.75 | 0.25 | 0.25 | 0.25 | 0.00 | 0.00 |" in md
    assert "| three | best of them | 0.75 | 0.75 | 0.75 | 0.50 | 0.25 | 0.00 |" in md
    l31 = next(x for x in md.split("## Run three")[1].splitlines() if x.startswith("| L3/1 "))
    assert "| 3x | 2x | 1.25x | 1.25x (compile_ro) |" in l31
