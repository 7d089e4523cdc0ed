"""The demo's material: scripted kernels, the bundled example runs, and the page it writes."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
from kloop.agent.demo import examples
from kloop.agent.demo.kernels import SIZES, source
from kloop.agent.store import RunStore
from kloop.evaluator.harness.precheck import check_overrides, precheck_source
from kloop.problems.registry import get_problem

REPO = Path(__file__).resolve().parents[2]
RUNS = {s: REPO / "runs" / "examples" / name for s, name in examples.RUNS.items()}


@pytest.mark.parametrize("pid", list(SIZES))
def test_each_kernel_variant_is_what_it_says(pid):
    check_overrides(get_problem(pid).source, SIZES[pid], pid)
    for variant in ("crash", "wrong", "ok", "ok_fast"):
        assert precheck_source(source(pid, variant)) is None, variant
        ast.parse(source(pid, variant))
    assert precheck_source(source(pid, "syntax")).kind == "syntax"
    assert len({source(pid, v) for v in ("syntax", "crash", "wrong", "ok", "ok_fast")}) == 5


def test_the_example_runs_compare_strategies_at_a_matched_budget():
    turns = {s: RunStore.open(r).turns() for s, r in RUNS.items()}
    for s, ts in turns.items():
        assert {t.problem_id for t in ts} == set(SIZES), s
        assert len({t.problem_id for t in ts}) >= 5
        # The replies are the scripted kernels, the token counts counted (and marked so).
        assert all(t.reply.raw["scripted"]["usage_counted_by"] == "kloop-approx-v1" for t in ts)
        assert all(t.reply.usage.output_tokens > 0 and t.reply.usage.input_tokens > 0 for t in ts)
    for pid in SIZES:
        calls = {s: sum(t.spend.calls for t in ts if t.problem_id == pid) for s, ts in turns.items()}
        assert calls == {"sequential": 4, "best_of_n": 4}, pid
    # What each strategy was given is what it recorded.
    for s, plan in examples.PLANS.items():
        for pid, variants in plan.items():
            recorded = sorted((t for t in turns[s] if t.problem_id == pid), key=lambda t: (t.episode, t.turn))
            assert [t.code for t in recorded] == [
                source(pid, v) for v in variants], (s, pid)
    solved = {s: {t.problem_id for t in ts if t.status == "correct"} for s, ts in turns.items()}
    assert solved["sequential"] == set(SIZES)  # feedback between turns fixes every problem
    assert len(solved["best_of_n"]) == 3       # independent first attempts do not


def test_the_demo_page_has_data_in_every_table(tmp_path):
    run = RUNS["sequential"]
    picked = examples.sample(run)
    assert {t.problem_id for t in picked} == set(SIZES)
    checked = [examples.Rejudged(
        problem_id=t.problem_id, family="f", kernel=t.kernel_path, recorded=t.status,
        recorded_device=t.eval.device, recorded_runtime_ms=t.eval.runtime_ms, recorded_clock="host",
        now=t.status, now_device="cpu", now_runtime_ms=1.0, match=True, seconds=1.0) for t in picked]
    examples.write_summary(tmp_path, [RUNS["sequential"], RUNS["best_of_n"]], checked)
    page = (tmp_path / "demo.md").read_text()
    tables = [block for block in page.split("\n\n") if block.startswith("|")]
    assert len(tables) == 2
    for table in tables:
        header, _, *rows = table.splitlines()
        assert rows and all(r.count("|") == header.count("|") for r in rows)
    assert "none correct" in page and "correct (ep 0 turn" in page
    assert f"{len(checked)}/{len(checked)} verdicts match" in page
    on_gpu = any(t.eval.device.startswith("cuda") for t in picked)
    # Recorded on a CPU, the page says where the H200 numbers will go; on a GPU, it shows them.
    assert ("Runtimes are medians by kloop's harness clock on the recording GPU" in page) == on_gpu
    assert ("(NVIDIA H200)" in page) == on_gpu  # the GPU is named, from the records
    assert ("H200 numbers: not recorded yet" in page) == (not on_gpu)


def test_the_demo_report_and_kloop_report_resample_alike(tmp_path, monkeypatch):
    """The same runs give the same intervals in the demo's report and in `kloop report`."""
    from kloop.agent.cli import main
    from kloop.agent.report import build

    used = []
    real = build.build_report
    monkeypatch.setattr(build, "build_report", lambda paths, **kw: used.append(kw["n_boot"]) or real(paths, n_boot=0))
    monkeypatch.setattr(examples, "rejudge", lambda run, device: [])
    monkeypatch.setattr(examples, "write_summary", lambda out, runs, checked: None)
    examples.demo(tmp_path / "demo", "cpu")
    runs = [examples.EXAMPLES / examples.RUNS["sequential"], examples.EXAMPLES / examples.RUNS["best_of_n"]]
    with pytest.raises(SystemExit) as done:
        main(["report", *map(str, runs), "--out", str(tmp_path / "report")])
    assert done.value.code == 0
    assert len(used) == 2 and used[0] == used[1]
