"""`kloop run`, `--resume`, `kloop replay` and `kloop show` through the Typer app.

Only the evaluator is swapped for the FakeEvaluator (the real one is tested on its own and in
test_evaluator_integration.py); the CLI, config, loop and store are the real ones.
"""

from __future__ import annotations

import json

import pytest
import yaml
from agent_fakes import FakeEvaluator, kernel, reply, run_kloop
from kloop.agent import components
from kloop.agent.store import RunStore


@pytest.fixture
def fake_evaluator(monkeypatch):
    ev = FakeEvaluator()
    monkeypatch.setattr(components, "build_evaluator", lambda cfg, problems: ev)
    monkeypatch.setattr("kloop.agent.run.build_evaluator", lambda cfg, problems: ev)
    monkeypatch.setattr("kloop.agent.replay.build_evaluator", lambda cfg, problems: ev)
    return ev


def script(tmp_path, replies) -> str:
    path = tmp_path / "replies.yaml"
    path.write_text(yaml.safe_dump([{"text": r, "usage": {"input_tokens": 100, "output_tokens": 10}}
                                    for r in replies]))
    return f"scripted:{path}"


def invoke(*args):
    result = run_kloop(*args)
    return result


def test_kloop_run_with_flags_and_a_config_file(tmp_path, fake_evaluator):
    exp = tmp_path / "exp.yaml"
    exp.write_text("strategy:\n  turns: 3\nagent:\n  context: last\n")
    model = script(tmp_path, [reply(kernel("BUG")), reply(kernel(runtime_ms=0.5)), "no code"])
    res = invoke("run", "-c", exp, "-c", "agent.max_consecutive_format_errors=2", "--problem", "L3/1",
                 "--model", model, "--runs-dir", tmp_path / "runs", "-c", "run_id=r1", "--budget-calls", 10)
    assert res.exit_code == 0, res.output
    root = tmp_path / "runs" / "r1"
    record = json.loads((root / "config.json").read_text())
    assert record["config"]["strategy"]["turns"] == 3 and record["config"]["agent"]["context"] == "last"
    assert record["config"]["budget"]["run"]["calls"] == 10 and len(record["digest"]) == 64
    assert record["kloop_version"] and "git_commit" in record
    store = RunStore.open(root)
    assert [t.status for t in store.turns()] == ["incorrect", "correct", "format_error"]
    assert store.summary().spend.input_tokens == 300
    assert "L3/1" in res.output and "0.5 ms" in res.output
    assert "x best" in res.output and "4x eager" in res.output  # the fastest baseline, named

    shown = invoke("show", root, "--problem", "L3/1", "--turn", 2)
    assert shown.exit_code == 0, shown.output
    assert "turn 2" in shown.output and "correct" in shown.output and "turn 1 " not in shown.output


def test_kloop_run_resume_continues_an_interrupted_run(tmp_path, fake_evaluator):
    first = [reply(kernel("BUG"))]
    model = script(tmp_path, first)  # runs out after one turn: infra_error
    out = tmp_path / "runs" / "r2"
    res = invoke("run", "--problem", "L3/1", "--model", model, "--turns", 2, "--out", out)
    assert res.exit_code == 0, res.output
    assert RunStore.open(out).episodes()[0].stop_reason == "infra_error"
    # The script gets its second reply (in real life: the provider came back) and the run resumes
    # after the reply it already used.
    (tmp_path / "replies.yaml").write_text(yaml.safe_dump(first + [reply(kernel(runtime_ms=0.4))]))
    res = invoke("run", "--resume", out)
    assert res.exit_code == 0, res.output
    store = RunStore.open(out)
    assert [(t.turn, t.status) for t in store.turns()] == [(1, "incorrect"), (2, "correct")]
    assert store.episodes()[-1].stop_reason == "max_turns"

    refused = invoke("run", "--resume", out, "--turns", 5)
    assert refused.exit_code == 2 and "saved config" in refused.output


def test_kloop_replay_and_rescore(tmp_path, fake_evaluator):
    model = script(tmp_path, [reply(kernel("BUG")), reply(kernel(runtime_ms=0.5))])
    src = tmp_path / "runs" / "src"
    assert invoke("run", "-p", "L3/1", "--model", model, "--turns", 2, "--out", src).exit_code == 0
    res = invoke("replay", src, "--out", tmp_path / "runs" / "again")
    assert res.exit_code == 0, res.output
    assert "same verdict" in res.output
    res = invoke("replay", src, "--rescore", "--out", tmp_path / "runs" / "rescored")
    assert res.exit_code == 0, res.output
    assert RunStore.open(tmp_path / "runs" / "rescored").config_record().kind == "rescore"


def test_bad_input_gets_a_clear_error(tmp_path, fake_evaluator):
    res = invoke("run", "--problem", "L3/999", "--model", "scripted:x", "--runs-dir", tmp_path)
    assert res.exit_code == 2 and "unknown problem" in res.output
    res = invoke("run", "--problem", "L3/1", "--model", "nosuch:x", "--runs-dir", tmp_path)
    assert res.exit_code == 2 and "unknown model provider" in res.output
    res = invoke("run", "--problem", "L3/1", "--model", "scripted:x", "-c", "strategy.kind=dfs",
                 "--runs-dir", tmp_path)
    assert res.exit_code == 2 and "strategy.kind" in res.output
    assert list(tmp_path.iterdir()) == []  # nothing was created for a refused run


def test_run_size_small_records_the_shrunk_constants(tmp_path, fake_evaluator):
    model = script(tmp_path, [reply(kernel(runtime_ms=0.5))])
    out = tmp_path / "runs" / "small"
    res = invoke("run", "-p", "L3/1", "--model", model, "--turns", 1, "--size", "small",
                 "-c", "problem_overrides={L3/1: {batch_size: 1}}", "--out", out)
    assert res.exit_code == 0, res.output
    sizes = RunStore.open(out).config_record().config.problem_overrides
    assert sizes == {"L3/1": {"batch_size": 1, "input_size": 512, "layer_sizes": [512, 512],
                              "output_size": 256}}  # --size small under the explicit batch size
    # The model is shown the sizes it is judged at, not the problem file's full ones.
    task = RunStore.open(out).turns()[0].messages[1].content
    assert "batch_size = 1\n" in task and "input_size = 512\n" in task
    assert "layer_sizes = [512, 512]\n" in task and "16384" not in task and "= 128" not in task
    assert "at the sizes it is judged at" in task
