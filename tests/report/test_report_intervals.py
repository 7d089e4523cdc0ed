"""Reports under noise: fast_p counts a speedup only when its interval over paired rounds clears
p (the point estimate where there is no interval), and says which rule it used; the best kernel
and the tables carry the intervals."""

from __future__ import annotations

from kloop.agent.report.build import build_report, write_report
from kloop.agent.report.curves import curve
from kloop.agent.report.load import load_run
from kloop.agent.report.metrics import P_VALUES, compute_metrics, problem_rows
from report_fixtures import T, write_run

PROBLEMS = ["L3/1", "L3/2", "L3/3", "L3/4", "L3/5"]
BELOW = "below_clock_resolution: a median under 5x the handshake (0.012 ms)"
TURNS = [
    T("L3/1", eager=1.3, runtime_ms=1.0, ci={"eager": (1.1, 1.5)}),
    # Faster by its median, but inside the noise of turn 1: turn 1 stays the best.
    T("L3/1", eager=1.4, runtime_ms=0.93, ci={"eager": (1.2, 1.6)}),
    T("L3/2", eager=1.2, ci={"eager": (0.95, 1.45)}),  # above 1.0, its interval is not
    T("L3/3", "incorrect"),
    T("L3/4", eager=2.0, compile=1.1, ci={"eager": (1.9, 2.1), "compile": (0.9, 1.3)}, flags=(BELOW,)),
    T("L3/5", eager=1.5),  # a record from before paired timing: its point estimate
]


def test_fast_p_counts_a_speedup_only_when_its_interval_clears_p(tmp_path):
    run = load_run(write_run(tmp_path / "r", PROBLEMS, TURNS))
    rows = problem_rows(run)
    assert (rows[0].best_turn, rows[0].speedup_vs_eager, rows[0].speedup_ci["eager"].low) == (1, 1.3, 1.1)
    assert rows[3].speedup_ci["best"].high == 1.3 and rows[3].below_clock_resolution
    m = compute_metrics([rows], n_boot=0)
    # Point estimates would give 4/5 (L3/2's 1.2x); its interval reaches down to 0.95.
    assert m.fast(1.0) == 0.6 and m.fast(0.8) == 0.8
    assert m.fast(1.0, "compile") == 0.0 and m.fast(0.8, "compile") == 0.2
    assert m.geomean_vs_eager.value == (1.3 * 1.2 * 2.0 * 1.5) ** 0.25  # geomeans stay on the points
    assert (m.with_interval, m.point_only, m.interval_level, m.below_clock_resolution) == (3, 1, 0.95, 1)
    assert m.fast_sentence(1.0) == ("fast_1.0 vs eager: 3/5 (a speedup counts only when its 95 % interval "
                                    "clears 1.0; where it has none (1 kernel(s)), when its point estimate "
                                    "is above 1.0)")
    # The budget curves count the same way.
    last = curve(run, "turns").points[-1]
    assert last.fast_eager[P_VALUES.index(1.0)] == 0.6

    only_paired = compute_metrics([rows[:4]], n_boot=0)
    assert only_paired.fast_sentence(1.0) == ("fast_1.0 vs eager: 2/4 (a speedup counts only when its "
                                              "95 % interval clears 1.0)")
    old = load_run(write_run(tmp_path / "old", ["L3/1", "L3/2"], [T("L3/1", eager=1.3), T("L3/2", eager=0.9)]))
    assert compute_metrics([problem_rows(old)], n_boot=0).fast_sentence(1.0) == (
        "fast_1.0 vs eager: 1/2 (no speedup has an interval over paired rounds: a speedup counts when "
        "its point estimate is above 1.0)")


def test_the_report_states_the_rule_and_shows_the_intervals(tmp_path):
    out = tmp_path / "report"
    write_report(build_report([write_run(tmp_path / "r", PROBLEMS, TURNS)], n_boot=50), out)
    md = (out / "report.md").read_text()
    assert ("fast_1.0 vs eager: 3/5 (a speedup counts only when its 95 % interval clears 1.0; where it "
            "has none (1 kernel(s)), when its point estimate is above 1.0)") in md
    assert "| 1.3x [1.1, 1.5] |" in md and "| 2x [1.9, 2.1] | 1.1x [0.9, 1.3] |" in md
    assert "| 1.5x |" in md  # no interval: the point alone
    assert "ep 0 turn 1" in md  # the best kernel of L3/1 is its first
    assert "1 best kernel(s) flagged below_clock_resolution" in md


def test_show_and_the_plots_draw_the_intervals(tmp_path, monkeypatch):
    from kloop.agent.report import plots
    from kloop.agent.report.show import verdict_table
    from rich.console import Console

    run = load_run(write_run(tmp_path / "r", PROBLEMS, TURNS))
    console = Console(width=200, record=True)
    console.print(verdict_table(run.turns[0].eval))
    text = console.export_text()
    assert "1.3x [1.1, 1.5] vs eager" in text and "(intervals: 95 %, over 10 paired rounds)" in text

    figures = []
    monkeypatch.setattr(plots, "_save", lambda fig, path, legend=False: figures.append(fig) or path)
    rows = problem_rows(run)
    plots.plot_speedups({"r": rows}, tmp_path / "s.png")
    plots.plot_fast_p({"r": compute_metrics([rows], n_boot=0)}, tmp_path / "f.png")
    speed, fast = figures
    eager_ax = speed.axes[0]
    assert "bars: 95 % interval" in eager_ax.get_title()
    # One bar per interval (L3/1, L3/2, L3/4), spanning exactly low..high.
    spans = sorted(tuple(round(x, 6) for x in seg[:, 0]) for c in eager_ax.collections
                   if hasattr(c, "get_segments") for seg in c.get_segments())
    assert spans == [(0.95, 1.45), (1.1, 1.5), (1.9, 2.1)]
    assert "interval's low end clears p" in fast.axes[0].get_title()
