"""A 2-cell sweep (4 turns x 1 sample vs 1 turn x 4 samples) through the real loop with a
scripted model: expansion, run, skip, resume, and budget curves read at known token budgets."""

from __future__ import annotations

import math
import textwrap

import pytest
from kloop.agent.models.scripted import ScriptedModel
from kloop.agent.report.build import build_report
from kloop.agent.report.curves import curve
from kloop.agent.report.load import load_targets
from kloop.agent.store import RunStore
from kloop.agent.sweep import SweepError, load_sweep, plan, run_sweep
from report_fixtures import MarkerEvaluator, scripted_reply

R = scripted_reply  # 100 tokens and $0.01 per reply
REPLIES = {
    # L3/1 turns 1-4, then L3/2 turns 1-4
    "sequential": [R("verdict=incorrect"), R("speedup=1.5"), R("speedup=2.5"), R("verdict=incorrect"),
                   R("verdict=compile_error"), R("verdict=compile_error"), R("speedup=1.2"), R("verdict=incorrect")],
    # L3/1 samples 0-3, then L3/2 samples 0-3
    "best_of_n": [R("speedup=1.1")] + [R("verdict=incorrect")] * 7,
}
SEQ, BON = "base__seq__base__base__seed0", "base__bon__base__base__seed0"


def sweep_file(tmp_path, extra: str = "") -> object:
    path = tmp_path / "sweep.yaml"
    path.write_text(textwrap.dedent(f"""\
        sweep:
          name: tvs
          out: {tmp_path / 'exp'}
          base: {{problems: [L3/1, L3/2], model: "scripted:unused", concurrency: 1}}
          strategies: [{{label: seq, turns: 4}}, {{label: bon, samples: 4, turns: 1}}]
        """) + extra)
    return path


def scripted(cfg, problems):
    return ScriptedModel(REPLIES[cfg.strategy.kind]), MarkerEvaluator()


@pytest.fixture
def experiment(tmp_path):
    outcomes = run_sweep(sweep_file(tmp_path), components=scripted)
    assert [(o.cell_id, o.action, o.status) for o in outcomes] == [
        (SEQ, "started", "finished"), (BON, "started", "finished")]
    return tmp_path / "exp"


def test_budget_curves_and_matched_budgets(experiment):
    loaded = load_targets([experiment])
    seq, bon = loaded.runs
    assert (seq.label, seq.axes["strategy"], bon.axes["strategy"]) == (SEQ, "seq", "bon")
    tokens = curve(seq, "tokens")
    pts = [(p.x, p.correct, p.fast_eager[3], round(p.geomean_eager, 4)) for p in tokens.points]
    assert pts == [(0, 0, 0, 1.0), (200, 0.5, 0.5, round(math.sqrt(1.5), 4)),
                   (300, 1.0, 1.0, round(math.sqrt(2.5 * 1.2), 4)), (400, 1.0, 1.0, round(math.sqrt(3.0), 4))]
    assert [p.x for p in curve(bon, "calls").points] == [0, 1, 4]
    assert curve(seq, "dollars").total == pytest.approx(0.04)
    assert curve(seq, "tokens", scope="run").total == 800

    report = build_report([experiment], n_boot=0)
    at = {(m.axis, m.fraction): {r.label: r for r in m.rows} for m in report.matched}
    expect = {0.25: {SEQ: (0.0, 1.0), BON: (0.5, math.sqrt(1.1))},
              0.5: {SEQ: (0.5, math.sqrt(1.5)), BON: (0.5, math.sqrt(1.1))},
              1.0: {SEQ: (1.0, math.sqrt(3.0)), BON: (0.5, math.sqrt(1.1))}}
    for frac, cells in expect.items():
        for label, (fast1, geo) in cells.items():
            row = at[("tokens", frac)][label]
            assert (row.fast_eager[3], row.geomean_eager) == (fast1, pytest.approx(geo))
    assert at[("tokens", 1.0)][SEQ].total == 400
    # The end of every curve is the run's own metrics.
    for r in report.runs:
        end = next(c for c in r.curves if c.axis == "turns").points[-1]
        assert end.fast_eager == [f.vs_eager.value for f in r.metrics.fast_p]


def test_rerun_skips_finished_cells(experiment, tmp_path):
    before = len(RunStore.open(experiment / "cells" / SEQ).turns())
    outcomes = run_sweep(sweep_file(tmp_path), components=scripted)
    assert [o.action for o in outcomes] == ["skipped", "skipped"]
    assert len(RunStore.open(experiment / "cells" / SEQ).turns()) == before == 8


def test_cut_off_cell_is_resumed_without_repeating_turns(tmp_path):
    path = sweep_file(tmp_path)
    first = lambda cfg, ps: (ScriptedModel(REPLIES[cfg.strategy.kind][:5]), MarkerEvaluator())  # noqa: E731
    run_sweep(path, components=first, only=[SEQ])
    cell = tmp_path / "exp" / "cells" / SEQ
    assert len(RunStore.open(cell).turns()) == 5  # the 6th query found no reply: infra_error
    # The whole script again: resume continues after the 5 replies the cell already holds.
    rest = lambda cfg, ps: (ScriptedModel(REPLIES[cfg.strategy.kind]), MarkerEvaluator())  # noqa: E731
    outcomes = run_sweep(path, components=rest, only=[SEQ])
    assert [o.action for o in outcomes] == ["resumed"]
    turns = RunStore.open(cell).turns()
    assert sorted((t.problem_id, t.turn) for t in turns) == [(p, i) for p in ("L3/1", "L3/2") for i in range(1, 5)]
    m = build_report([cell], n_boot=0).runs[0].metrics
    assert (m.correct, m.fast(1.0), m.fast(1.5)) == (2, 1.0, 0.5)


def test_changed_sweep_does_not_touch_started_cells(experiment, tmp_path):
    changed = tmp_path / "sweep.yaml"
    changed.write_text(changed.read_text().replace("concurrency: 1", "concurrency: 1, budget: {run: {calls: 3}}"))
    with pytest.raises(SweepError, match="different config"):
        run_sweep(changed, components=scripted)


def test_sweep_files_are_validated(tmp_path):
    bad = sweep_file(tmp_path, "  colour: blue\n")
    with pytest.raises(SweepError, match="colour"):
        load_sweep(bad)
    typo = tmp_path / "typo.yaml"
    typo.write_text(sweep_file(tmp_path).read_text().replace("turns: 4", "turn: 4"))
    with pytest.raises(SweepError, match="turn"):
        plan(typo)


def test_toml_sweep_expands_the_product(tmp_path):
    path = tmp_path / "sweep.toml"
    path.write_text(textwrap.dedent("""\
        [sweep]
        name = "grid"
        base = { problems = ["L3/1"], model = "scripted:unused" }
        models = ["openai:gpt-x", { spec = "anthropic:claude-y", label = "claude" }]
        strategies = [{ turns = 8, samples = 4 }, { samples = 32 }]
        contexts = ["full", { context = "last_k", context_k = 3 }]
        feedback = [{ label = "prof", profile_feedback = true }, { label = "plain", profile_feedback = false }]
        seeds = [0, 1]
        """))
    cells = plan(path)
    assert len(cells) == 2 * 2 * 2 * 2 * 2
    c = next(c for c in cells if c.cell_id == "claude__32x1__last3__plain__seed1")
    cfg = c.config
    assert (cfg.model.spec, cfg.strategy.kind, cfg.strategy.samples, cfg.agent.context, cfg.agent.context_k,
            cfg.agent.profile_feedback, cfg.seed) == ("anthropic:claude-y", "best_of_n", 32, "last_k", 3, False, 1)


def test_seeds_of_a_sweep_are_grouped(tmp_path):
    path = sweep_file(tmp_path, "  seeds: [0, 1]\n")
    path.write_text(path.read_text().replace(", {label: bon, samples: 4, turns: 1}", ""))
    outcomes = run_sweep(path, components=scripted)
    assert [o.cell_id for o in outcomes] == ["base__seq__base__base__seed0", "base__seq__base__base__seed1"]
    report = build_report([tmp_path / "exp"], n_boot=100)
    [group] = report.seed_groups
    assert (group.label, group.seeds, group.runs) == ("base__seq__base__base", [0, 1], [o.cell_id for o in outcomes])
    assert group.metrics.fast(1.5) == 0.5 and group.metrics.correct == 2


def test_a_budgets_axis_compares_budgets(tmp_path):
    path = sweep_file(tmp_path, "  budgets: [{run: {calls: 2}}, {label: big, run: {calls: 9}}]\n")
    cells = plan(path)
    assert [c.cell_id for c in cells] == [
        "base__seq__base__base__run-calls2__seed0", "base__seq__base__base__big__seed0",
        "base__bon__base__base__run-calls2__seed0", "base__bon__base__base__big__seed0"]
    assert [c.config.budget.run.calls for c in cells] == [2, 9, 2, 9]
    assert all(c.axes["budget"] in ("run-calls2", "big") for c in cells)
    outcomes = run_sweep(path, components=scripted)
    assert [o.status for o in outcomes] == ["budget", "finished", "budget", "finished"]
    spent = [RunStore.open(o.path).summary().spend.calls for o in outcomes]
    assert spent == [2, 8, 2, 8]


def test_sweep_progress_one_line_per_cell_piped_and_on_a_terminal(tmp_path):
    import io

    from kloop.agent.run import SweepProgress
    from rich.console import Console

    seen = []
    piped = io.StringIO()
    with SweepProgress(Console(file=piped, force_terminal=False, width=200)) as progress:
        def both(p):
            seen.append(p)
            progress.update(p)
        run_sweep(sweep_file(tmp_path), components=scripted, on_cell=both)
    lines = piped.getvalue().splitlines()
    # Printed as it happened: both cells waiting, then the first cell's turns one by one, done
    # before the second starts.
    assert lines[:2] == [f"[1/2] {SEQ}: waiting", f"[2/2] {BON}: waiting"]
    assert f"[1/2] {SEQ}: running, 1/8 turns, 0 correct, 1 calls" in lines
    first_done = lines.index(f"[1/2] {SEQ}: finished, 8/8 turns, 3 correct, 8 calls")
    assert first_done < lines.index(f"[2/2] {BON}: running, 0/8 turns, 0 correct, 0 calls")
    assert lines[-1] == f"[2/2] {BON}: finished, 8/8 turns, 1 correct, 8 calls"
    assert len(lines) == len(set(lines))  # printed on change only

    # On a terminal the same lines are redrawn in place: the last frame holds one per cell.
    tty = io.StringIO()
    with SweepProgress(Console(file=tty, force_terminal=True, width=200)) as progress:
        for p in seen:
            progress.update(p)
    frame = tty.getvalue().rsplit("waiting", 1)[-1]
    assert f"[1/2] {SEQ}: finished, 8/8 turns" in tty.getvalue()
    assert f"[2/2] {BON}: finished, 8/8 turns, 1 correct, 8 calls" in frame
    assert "\x1b[" in tty.getvalue()  # cursor movement: redrawn, not appended
    # Skipped on a second run: one line each, nothing runs.
    again = []
    run_sweep(sweep_file(tmp_path), components=scripted, on_cell=again.append)
    assert [p.line() for p in again if p.state == "skipped"] == [
        f"[1/2] {SEQ}: skipped (finished earlier)", f"[2/2] {BON}: skipped (finished earlier)"]
