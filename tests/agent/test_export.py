"""`kloop export --format messages|parquet`: training records out of a real run directory
(the real CLI, loop and store; the FakeEvaluator judges), read back by `datasets`."""

from __future__ import annotations

import json
import math

import pytest
import yaml
from agent_fakes import (
    EAGER_MS,
    FakeEvaluator,
    kernel,
    make_runner,
    reply,
    run_kloop,
    with_interval,
)

from kloop.agent import components
from kloop.agent.export import EXPORT_REWARD, REDACTED, _interval, examples, reward

TOKEN, SALT, KEY = "tok-PLANTED-0123456789", "salt-PLANTED-9876543210", "sk-PLANTED-KEY-55555"


@pytest.fixture
def run_dir(tmp_path, monkeypatch):
    ev = FakeEvaluator()
    monkeypatch.setattr(components, "build_evaluator", lambda cfg, problems: ev)
    monkeypatch.setattr("kloop.agent.run.build_evaluator", lambda cfg, problems: ev)
    script = tmp_path / "replies.yaml"
    script.write_text(yaml.safe_dump([reply(kernel("BUG")), reply(kernel(runtime_ms=0.5)),
                                      "no code here", reply(kernel("CHEAT"))]))
    out = tmp_path / "run"
    res = run_kloop("run", "-p", "L3/1", "--model", f"scripted:{script}", "--turns", 4, "--out", out)
    assert res.exit_code == 0, res.output
    # Plant what must never leave: a base URL with a token, the hidden seed salt, a provider
    # key, in the config and inside the text and raw responses of the turns.
    record = json.loads((out / "config.json").read_text())
    record["config"]["model"]["base_url"] = f"https://proxy.example/v1?token={TOKEN}"
    record["config"]["eval"]["salt"] = SALT
    (out / "config.json").write_text(json.dumps(record))
    monkeypatch.setenv("OPENAI_API_KEY", KEY)
    lines = []
    for line in (out / "turns.jsonl").read_text().splitlines():
        t = json.loads(line)
        t["reply"]["raw"] = {"headers": {"authorization": KEY}, "seed": SALT}
        t["messages"][-1]["content"] += f"\n(proxy https://proxy.example/v1?token={TOKEN}, salt {SALT})"
        t["feedback"] += f" key {KEY}"
        lines.append(json.dumps(t))
    (out / "turns.jsonl").write_text("\n".join(lines) + "\n")
    return out


def test_messages_per_turn_and_per_episode(run_dir, tmp_path):
    out = tmp_path / "turns.jsonl"
    res = run_kloop("export", run_dir, "--format", "messages", "--out", out)
    assert res.exit_code == 0, res.output
    text = out.read_text()
    assert TOKEN not in text and SALT not in text and KEY not in text and REDACTED in text
    rows = [json.loads(line) for line in text.splitlines()]
    assert [r["verdict"] for r in rows] == ["incorrect", "correct", "format_error", "rejected"]
    assert [r["reward"] for r in rows] == pytest.approx([0.0, math.log(EAGER_MS / 0.5), -0.5, -1.0])
    assert rows[1]["speedup_vs_eager"] == pytest.approx(4.0) and rows[1]["speedup_ci"] is None
    assert all(r["schema_version"] == 1 and r["kind"] == "turn" for r in rows)
    # As the model saw them, then its reply; turn 2 was sent turn 1's reply and feedback.
    assert [m["role"] for m in rows[1]["messages"]] == ["system", "user", "assistant", "user", "assistant"]
    assert rows[1]["messages"][-1]["content"].startswith("Here is my kernel.")
    assert '"raw"' not in text and "authorization" not in text

    per_episode = tmp_path / "episodes.jsonl"
    assert run_kloop("export", run_dir, "--format", "messages", "--per", "episode",
                     "--out", per_episode).exit_code == 0
    (ep,) = [json.loads(line) for line in per_episode.read_text().splitlines()]
    assert ep["verdicts"] == [r["verdict"] for r in rows] and ep["reward"] == pytest.approx(math.log(4.0))
    assert ep["messages"] == rows[-1]["messages"]


def test_parquet_and_jsonl_load_with_datasets(run_dir, tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    datasets = pytest.importorskip("datasets")
    parquet, jsonl = tmp_path / "turns.parquet", tmp_path / "turns.jsonl"
    assert run_kloop("export", run_dir, "--format", "parquet", "--out", parquet).exit_code == 0
    assert run_kloop("export", run_dir, "--format", "messages", "--out", jsonl).exit_code == 0
    expected = [json.loads(line) for line in jsonl.read_text().splitlines()]
    cache = str(tmp_path / "hf")
    for kind, path in (("parquet", parquet), ("json", jsonl)):
        ds = datasets.load_dataset(kind, data_files=str(path), split="train", cache_dir=cache)
        assert len(ds) == 4 and ds.column_names == list(expected[0])
        assert [dict(r) for r in ds] == expected
    assert SALT.encode() not in parquet.read_bytes() and TOKEN.encode() not in parquet.read_bytes()


def test_reward_is_one_configurable_function_and_reads_an_interval_if_recorded():
    ev = FakeEvaluator().evaluate
    from kloop.problems.registry import get_problem

    p = get_problem("L3/1")
    fast, bad = ev(p, kernel(runtime_ms=1.0)), ev(p, kernel("CHEAT"))
    assert reward(fast) == pytest.approx(math.log(2.0))
    weights = EXPORT_REWARD.model_copy
    assert reward(fast, weights(update={"correct": 1.0})) == pytest.approx(1.0 + math.log(2.0))
    assert reward(bad, weights(update={"rejected": -3.0})) == -3.0 and reward(None) == -0.5
    # A result timed in paired rounds gives its eager speedup's interval, as the evaluator
    # records it (`EvalResult.speedup_ci["eager"]`); one against another baseline only, none.
    paired = ev(p, kernel(runtime_ms=1.0, ci=(1.8, 2.2)))
    assert _interval(paired).model_dump() == {"lo": 1.8, "hi": 2.2}
    assert _interval(fast) is None and _interval(None) is None
    only_compile = with_interval(fast, 0.9, 1.1, baseline="compile")
    assert _interval(only_compile) is None


def test_examples_skip_imported_kernels_never_judged(tmp_path):
    src = tmp_path / "kb"
    src.mkdir()
    (src / "level_3_problem_1_sample_0_kernel.py").write_text(kernel())
    run = tmp_path / "imported"
    assert run_kloop("import", "kernelbench", src, "--out", run).exit_code == 0
    assert list(examples(run)) == []


def test_an_agent_run_exports_its_tool_calls_and_results(tmp_path):
    from test_agentic import FAST, WRONG, call

    from kloop.agent.components import load_problems
    from kloop.agent.export import export

    replies = [call("problem"), call("evaluate", WRONG), call("evaluate", FAST), call("submit", FAST)]
    runner, _ = make_runner(tmp_path, replies, FakeEvaluator(), strategy={"kind": "agent", "turns": 8})
    runner.run(load_problems(runner.cfg))
    out = tmp_path / "agent.jsonl"
    assert export(tmp_path / "run", out, "messages") == 2  # the judged steps; problem() and submit judge nothing
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["verdict"] for r in rows] == ["incorrect", "correct"]
    last = rows[1]["messages"]
    # The conversation as the model had it: each reply's call, then that call's result.
    assert [m["role"] for m in last] == ["system", "user", "assistant", "tool", "assistant", "tool",
                                        "assistant"]
    assert [m["tool_call_id"] for m in last if m["role"] == "tool"] == ["call_problem", "call_evaluate"]
    assert last[-1]["tool_calls"] == [{"id": "call_evaluate", "name": "evaluate",
                                       "arguments": json.dumps({"code": FAST})}]
    assert "tool_calls" not in last[0] and "tool_call_id" not in last[0]
