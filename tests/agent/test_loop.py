"""The real loop, store and prompts end to end, with a ScriptedModel and a FakeEvaluator."""

from __future__ import annotations

import json

from agent_fakes import FakeEvaluator, kernel, make_runner, reply
from kloop.agent.components import load_problems
from kloop.agent.models.base import ModelReply, Usage
from kloop.agent.records import TurnRecord


def run(runner):
    return runner.run(load_problems(runner.cfg))


def test_episode_logs_every_turn_and_picks_the_fastest_correct_kernel(tmp_path):
    replies = [
        reply(kernel("x = 1\nSYNTAX error here")),
        "I think we should fuse the layers.",  # no code: a model fault, still a turn
        reply(kernel("BUG")),
        reply(kernel(runtime_ms=0.5)),
        reply(kernel(runtime_ms=0.8)),  # correct but slower: not the best
    ]
    runner, model = make_runner(tmp_path, replies, strategy={"turns": 5})
    summary = run(runner)
    root = runner.store.root

    lines = (root / "turns.jsonl").read_text().splitlines()
    turns = [TurnRecord.model_validate_json(line) for line in lines]
    assert [t.turn for t in turns] == [1, 2, 3, 4, 5]
    assert [t.status for t in turns] == ["compile_error", "format_error", "incorrect", "correct", "correct"]
    assert all(json.loads(line)["schema_version"] == 1 for line in lines)
    # The record holds what the model saw and said, the code with its hash and file, the feedback.
    t1 = turns[0]
    assert t1.messages[0].role == "system" and "1_MLP" in t1.messages[1].content
    assert t1.reply.text == replies[0]
    assert (root / t1.kernel_path).read_text() == t1.code
    assert t1.kernel_path == "kernels/1_MLP/0-1.py"
    assert "candidate.py:3:5: error: invalid syntax (x2)" in t1.feedback
    assert turns[1].code is None and turns[1].fault.type == "NoKernelFound"
    assert "no fenced ```python code block" in turns[1].feedback
    assert "max abs error 0.5" in turns[2].feedback and "[3, 7] expected 0.25 got 0.75" in turns[2].feedback
    assert "Median runtime 0.5 ms" in turns[3].feedback and "4.00x" in turns[3].feedback
    # Turn 2's prompt carries turn 1's reply and feedback (full history by default).
    assert [m.role for m in turns[1].messages] == ["system", "user", "assistant", "user"]
    assert turns[1].messages[3].content == t1.feedback

    episodes = runner.store.episodes()
    assert len(episodes) == 1
    ep = episodes[0]
    assert ep.stop_reason == "max_turns" and ep.turns == 5
    assert ep.best.turn == 4 and ep.best.runtime_ms == 0.5 and ep.best.comparable
    assert (root / "best" / "1_MLP.py").read_text() == turns[3].code
    assert summary.problems[0].best.turn == 4 and summary.spend.calls == 5
    assert json.loads((root / "summary.json").read_text())["status"] == "finished"
    assert model.remaining == 0


def test_consecutive_format_errors_stop_the_episode(tmp_path):
    replies = [reply(kernel("BUG")), "no code", "```python\nprint('no ModelNew')\n```", "```python\nunclosed"]
    runner, _ = make_runner(tmp_path, replies + [reply(kernel())],
                            strategy={"turns": 8}, agent={"max_consecutive_format_errors": 3})
    run(runner)
    ep = runner.store.episodes()[0]
    assert ep.stop_reason == "format_errors"
    assert ep.statuses == ["incorrect", "format_error", "format_error", "format_error"]
    faults = [t.fault.type for t in runner.store.turns() if t.fault]
    assert faults == ["NoKernelFound", "FormatError", "FormatError"]


def test_stop_when_correct_records_solved(tmp_path):
    runner, model = make_runner(tmp_path, [reply(kernel("BUG")), reply(kernel()), reply(kernel())],
                                strategy={"turns": 3}, agent={"stop_when_correct": True})
    run(runner)
    ep = runner.store.episodes()[0]
    assert (ep.stop_reason, ep.turns, model.remaining) == ("solved", 2, 1)


def test_evaluator_infra_error_ends_the_episode_but_not_the_run(tmp_path):
    replies = [reply(kernel("INFRA")), reply(kernel(runtime_ms=0.7))]
    ev = FakeEvaluator()
    runner, _ = make_runner(tmp_path, replies, ev, strategy={"kind": "best_of_n", "samples": 2})
    run(runner)
    first, second = sorted(runner.store.episodes(), key=lambda e: e.episode)
    assert first.stop_reason == "infra_error" and first.turns == 0
    assert "evaluation failed" in first.stop_detail and first.error.type == "EvalInfraError"
    # The unscored call was still paid for and is accounted, but no turn is logged for it.
    assert first.unrecorded_spend.calls == 1 and first.spend.calls == 1
    assert second.stop_reason == "max_turns" and second.best.runtime_ms == 0.7
    assert [t.episode for t in runner.store.turns()] == [1]


def test_provider_abort_is_an_infra_error_not_a_model_failure(tmp_path):
    runner, _ = make_runner(tmp_path, [reply(kernel("BUG"))], strategy={"turns": 3})
    run(runner)  # the script runs out at turn 2: ScriptExhausted is a ProviderAbort
    ep = runner.store.episodes()[0]
    assert ep.stop_reason == "infra_error" and ep.turns == 1
    assert "model call failed" in ep.stop_detail and ep.statuses == ["incorrect"]


def test_turn_records_usage_cost_and_empty_replies(tmp_path):
    priced = ModelReply(text="", usage=Usage(input_tokens=1000, output_tokens=200, reasoning_tokens=50),
                        cost_usd=0.01, finish_reason="length", latency_s=1.5, model="m",
                        raw={"id": "r1"}, retries=2)
    runner, model = make_runner(tmp_path, [priced, reply(kernel())], strategy={"turns": 2})
    run(runner)
    t1, t2 = runner.store.turns()
    assert t1.reply.raw == {"id": "r1"} and t1.reply.retries == 2
    assert (t1.spend.calls, t1.spend.input_tokens, t1.spend.cost_usd) == (1, 1000, 0.01)
    # An empty reply is shown back as such (some APIs refuse empty assistant messages).
    assert model.seen[1][2].content == "(empty reply)"
    assert runner.store.episodes()[0].spend.cost_usd == 0.01
