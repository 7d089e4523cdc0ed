"""KernelBench interop: import a generations folder, rescore it with the real rescore path (fake
evaluator), report it, export it back in KernelBench's layout, and `kloop show` a trajectory."""

from __future__ import annotations

import json

import pytest
import typer
from kloop.agent import replay as replay_lib
from kloop.agent.report.build import build_report
from kloop.agent.report_cli import register
from kloop.agent.store import RunStore
from report_fixtures import MarkerEvaluator, T, write_run
from typer.testing import CliRunner

KERNELS = {
    "level_3_problem_1_sample_0_kernel.py": "import torch\n# speedup=1.5\nclass ModelNew(torch.nn.Module):\n    pass\n",
    "level_3_problem_1_sample_1_kernel.py": "import torch\n# speedup=2.5\nclass ModelNew(torch.nn.Module):\n    pass\n",
    "level_3_problem_4_sample_0_kernel.py": "import torch\n# verdict=incorrect\nclass ModelNew(torch.nn.Module):\n    pass\n",
}


def cli(*args: str):
    app = typer.Typer()
    register(app)
    return CliRunner().invoke(app, list(args))


@pytest.fixture
def generations(tmp_path):
    src = tmp_path / "kb_run"
    src.mkdir()
    for name, text in KERNELS.items():
        (src / name).write_text(text)
    (src / "generation_config.yaml").write_text("model_name: some-model\ntemperature: 0.0\n")
    (src / "eval_results.json").write_text("{}")
    return src


def test_import_rescore_report_export_round_trip(generations, tmp_path):
    run = tmp_path / "runs" / "imported"
    result = cli("import", "kernelbench", str(generations), "--out", str(run))
    assert result.exit_code == 0, result.output
    store = RunStore.open(run)
    record = store.config_record()
    assert record.config.model.spec == "kernelbench-import:some-model"
    assert (record.config.strategy.kind, record.config.strategy.samples, record.config.strategy.turns) == ("best_of_n", 2, 1)
    turns = sorted(store.turns(), key=lambda t: (t.problem_id, t.episode))
    assert [(t.problem_id, t.episode, t.turn) for t in turns] == [("L3/1", 0, 1), ("L3/1", 1, 1), ("L3/4", 0, 1)]
    for t, name in zip(turns, KERNELS, strict=True):
        assert t.code == KERNELS[name] == (run / t.kernel_path).read_text()
        assert (t.messages, t.reply.text, t.eval, t.reply.cost_usd) == ([], "", None, None)
        # Unknown, not zero: no token counts stand in for the generating call's usage.
        assert t.reply.usage is None
        assert (t.spend.calls, t.spend.unmetered_calls, t.spend.total_tokens) == (1, 1, 0)
        assert t.reply.raw["kloop_import"]["file"] == name
    assert {e.stop_reason for e in store.episodes()} == {"max_turns"}

    before = build_report([run], n_boot=0).runs[0]
    assert [p.status for p in before.problems] == ["unevaluated", "unevaluated"]
    assert any("not evaluated yet" in w for w in before.warnings)
    assert {c.axis for c in before.curves if not c.available} == {"tokens", "dollars"}

    rescored = tmp_path / "runs" / "rescored"
    replay_lib.rescore(run, rescored, evaluator=MarkerEvaluator())
    after = build_report([rescored], n_boot=0).runs[0]
    assert [(p.status, p.speedup_vs_eager, p.best_episode) for p in after.problems] == [
        ("correct", 2.5, 1), ("incorrect", None, None)]
    assert after.metrics.fast(2.0) == 0.5

    best = tmp_path / "export_best"
    assert cli("export", str(rescored), str(best)).exit_code == 0
    assert sorted(p.name for p in best.glob("*_kernel.py")) == ["level_3_problem_1_sample_0_kernel.py"]
    assert (best / "level_3_problem_1_sample_0_kernel.py").read_text() == KERNELS["level_3_problem_1_sample_1_kernel.py"]
    manifest = json.loads((best / "kloop_export.json").read_text())
    assert manifest["kernels"][0]["speedup_vs_eager"] == 2.5

    everything = tmp_path / "export_all"
    assert cli("export", str(run), str(everything), "--all").exit_code == 0
    assert {p.name: p.read_text() for p in everything.glob("*_kernel.py")} == KERNELS


def test_import_refuses_what_it_cannot_map(tmp_path, generations):
    empty = tmp_path / "empty"
    empty.mkdir()
    result = cli("import", "kernelbench", str(empty), "--out", str(tmp_path / "r1"))
    assert result.exit_code == 2 and "no level_<L>_problem" in result.output
    (generations / "level_3_problem_99_sample_0_kernel.py").write_text("x = 1\n")
    result = cli("import", "kernelbench", str(generations), "--out", str(tmp_path / "r2"))
    assert result.exit_code == 2 and "level 3 problem 99" in result.output
    assert not (tmp_path / "r2").exists()


def test_show_prints_each_turn_with_verdict_and_feedback(tmp_path):
    run = write_run(tmp_path / "run", ["L3/1", "L3/2"],
                    [T("L3/1", "compile_error"), T("L3/1", eager=1.7, compile=1.3), T("L3/2", "incorrect")])
    result = cli("show", str(run), "--problem", "L3/1")
    assert result.exit_code == 0, result.output
    out = result.output
    assert "episode 0" in out and "turn 1: compile_error" in out and "turn 2: correct" in out
    assert "verdict: correct" in out and "1.7x vs eager" in out
    assert "FEEDBACK for turn 1: compile_error" in out and "FEEDBACK for turn 2: correct" in out
    assert "Write a kernel for 1_MLP" in out and "class ModelNew" in out
    assert "L3/2" not in out

    one = cli("show", str(run), "-p", "1_MLP", "--episode", "0", "--turn", "1").output
    assert "turn 1: compile_error" in one and "turn 2:" not in one

    index = cli("show", str(run))
    assert index.exit_code == 0 and "L3/2" in index.output and "max_turns" in index.output
    missing = cli("show", str(run), "--problem", "L3/9")
    assert missing.exit_code == 2 and "no turns of L3/9" in missing.output


def test_export_then_import_keeps_problem_size_overrides(tmp_path):
    from pathlib import Path

    example = Path(__file__).resolve().parents[2] / "runs" / "examples" / "l3-1-mlp-triton"
    sizes = RunStore.open(example).config_record().config.problem_overrides
    assert sizes  # the example runs L3/1 at a reduced size
    exported = tmp_path / "exported"
    assert cli("export", str(example), str(exported), "--all").exit_code == 0
    run = tmp_path / "imported"
    result = cli("import", "kernelbench", str(exported), "--out", str(run))
    assert result.exit_code == 0, result.output
    assert RunStore.open(run).config_record().config.problem_overrides == sizes


def test_report_of_a_tracked_run_is_written_outside_it(tmp_path, monkeypatch):
    from pathlib import Path

    from kloop.agent.report_cli import _default_out

    example = Path(__file__).resolve().parents[2] / "runs" / "examples" / "l3-1-mlp-triton"
    assert _default_out([example]) == Path("runs/reports/l3-1-mlp-triton")
    untracked = tmp_path / "r1"
    untracked.mkdir()
    assert _default_out([untracked]) == untracked / "report"
    assert _default_out([untracked, example]) == Path("runs/reports/r1-vs-l3-1-mlp-triton")


def test_rescore_of_an_import_takes_size_and_eval_overrides_and_keeps_imported_sizes(
        generations, tmp_path, monkeypatch, capsys):
    from kloop.agent.cli import main

    (generations / "kloop_export.json").write_text(json.dumps(
        {"problem_overrides": {"L3/1": {"batch_size": 4}}}))
    run = tmp_path / "imported"
    assert cli("import", "kernelbench", str(generations), "--out", str(run)).exit_code == 0
    judged_with = []

    def evaluator(cfg, problems):
        judged_with.append(cfg)
        return MarkerEvaluator()

    monkeypatch.setattr(replay_lib, "build_evaluator", evaluator)

    def kloop(*args: str) -> int:
        try:
            main([str(a) for a in args])
        except SystemExit as e:
            return e.code
        return 0

    out = tmp_path / "rescored"
    assert kloop("replay", run, "--rescore", "--size", "small", "-c", "eval.policy=kernelbench",
                 "--out", out) == 0
    printed = capsys.readouterr()
    cfg = judged_with[0]
    assert cfg.eval.policy == "kernelbench"
    # The import's own sizes stay; --size small shrinks the rest of each problem.
    assert cfg.problem_overrides["L3/1"]["batch_size"] == 4
    assert cfg.problem_overrides["L3/1"]["input_size"] == 512
    assert cfg.problem_overrides["L3/4"]["batch_size"] == 2
    assert RunStore.open(out).config_record().config == cfg
    # Kernels the import never judged get their first verdict; none of them "changed".
    text = printed.out + printed.err
    assert "format_error ->" not in text and "differs" not in text
    assert "3 kernel(s) never judged" in text
    assert json.loads((out / "replay_report.json").read_text())["first_judged"] == 3

    # -c changes how kernels are judged, nothing else; --size is for --rescore.
    assert kloop("replay", run, "--rescore", "-c", "strategy.turns=3", "--out", tmp_path / "x") == 2
    assert "only eval.* and problem_overrides" in "".join(capsys.readouterr())
    assert kloop("replay", run, "--size", "small", "--out", tmp_path / "y") == 2
    assert not (tmp_path / "x").exists() and not (tmp_path / "y").exists()
