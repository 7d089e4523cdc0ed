"""The tool-using agent (`strategy.kind: agent`) end to end: the real Runner, store, prompts and
agent loop, scripted replies that call tools, and the FakeEvaluator."""

from __future__ import annotations

import json

import pytest
from agent_fakes import FakeEvaluator, kernel, make_config, make_runner, reply
from kloop.agent.agentic import NOT_RUN, TOOLS
from kloop.agent.components import load_problems
from kloop.agent.extract import extract_code
from kloop.agent.models.scripted import ScriptedModel
from kloop.agent.store import RunStore
from kloop.agent.strategies import Runner
from kloop.problems.registry import Problem


def call(name: str, code: str | None = None, *, id: str | None = None, text: str = "") -> dict:
    """A scripted reply that calls one tool."""
    args = {} if code is None else {"code": code}
    return {"text": text, "finish_reason": "tool_calls",
            "usage": {"input_tokens": 100, "output_tokens": 10}, "cost_usd": 0.01,
            "tool_calls": [{"id": id or f"call_{name}", "name": name, "arguments": json.dumps(args)}]}


SLOW, FAST, WRONG = kernel(runtime_ms=1.5), kernel(runtime_ms=0.5), kernel("BUG")


def test_steps_are_recorded_charged_and_the_best_evaluated_kernel_wins(tmp_path):
    replies = [call("problem"), call("evaluate", WRONG), call("evaluate", FAST),
               call("profile", FAST), call("evaluate", SLOW), call("submit", SLOW)]
    evaluator = FakeEvaluator()
    runner, model = make_runner(tmp_path, replies, evaluator, strategy={"kind": "agent", "turns": 8})
    summary = runner.run([_problem(runner)])
    store = RunStore.open(tmp_path / "run")
    turns = store.turns()
    assert [t.tool.name for t in turns] == ["problem", "evaluate", "evaluate", "profile",
                                            "evaluate", "submit"]
    # profile and submit reuse the verdicts of steps 3 and 5: three judgements, no more.
    assert evaluator.calls == [WRONG, FAST, SLOW]
    assert [t.status for t in turns] == ["info", "incorrect", "correct", "info", "correct", "info"]
    assert "L3/1" in turns[0].feedback and "Sizes: as in the reference file" in turns[0].feedback
    assert turns[2].feedback.startswith("Step 3 of 8: correct.")
    assert "Reply with the complete" not in turns[2].feedback
    assert "fused_kernel" in turns[3].feedback and "judged at step 3" in turns[3].feedback
    [ep] = store.episodes()
    assert ep.stop_reason == "submitted" and ep.turns == 6
    # The submitted kernel is the slower one; the result is the fastest one evaluated.
    assert ep.best.turn == 3 and summary.problems[0].best.runtime_ms == 0.5
    assert (store.root / "best" / "1_MLP.py").read_text() == FAST
    # Every step is a charged call; every tool result is sent back under its call's id.
    assert summary.spend.calls == 6 and round(summary.spend.cost_usd, 6) == 0.06
    assert summary.spend.input_tokens == 600
    last = model.seen[-1]
    assert [m.role for m in last[:2]] == ["system", "user"] and "`evaluate(code)`" in last[0].content
    assert [(m.role, m.tool_call_id) for m in last[-2:]] == [("assistant", None),
                                                               ("tool", "call_evaluate")]
    # Each call is logged twice, before it is sent and with its reply; each step names its call.
    calls = store.calls()
    assert [c.phase for c in calls] == ["sent", "answered"] * 6
    answered = {c.call_id: c.reply for c in calls if c.phase == "answered"}
    assert {t.call_id: t.reply for t in turns} == answered


def _problem(runner: Runner) -> Problem:
    return load_problems(runner.cfg)[0]


def test_a_reply_without_a_call_submits_its_code_block_or_is_a_model_fault(tmp_path):
    replies = ["I will think first.", {"text": "", "tool_calls": [
        {"id": "a", "name": "evaluate", "arguments": "{not json"}]},
        {"text": "", "tool_calls": [{"id": "b", "name": "rm", "arguments": "{}"}]},
        reply(FAST, "Final answer.")]
    runner, _ = make_runner(tmp_path, replies, strategy={"kind": "agent", "turns": 8},
                            agent={"max_consecutive_format_errors": 4})
    runner.run([_problem(runner)])
    turns = RunStore.open(tmp_path / "run").turns()
    assert [t.status for t in turns] == ["format_error", "format_error", "format_error", "correct"]
    assert "called no tool" in turns[0].feedback
    assert "not a JSON object" in turns[1].feedback and "no tool 'rm'" in turns[2].feedback
    assert turns[3].tool.name == "submit" and turns[3].tool.id == ""
    [ep] = RunStore.open(tmp_path / "run").episodes()
    assert ep.stop_reason == "submitted" and ep.best.turn == 4


def test_format_errors_and_max_turns_stop_an_agent_as_they_stop_a_turn_loop(tmp_path):
    runner, _ = make_runner(tmp_path, ["no tools"] * 3, strategy={"kind": "agent", "turns": 8})
    runner.run([_problem(runner)])
    assert RunStore.open(tmp_path / "run").episodes()[0].stop_reason == "format_errors"
    runner, _ = make_runner(tmp_path, [call("evaluate", FAST)] * 2, run_id="two",
                            strategy={"kind": "agent", "turns": 2})
    runner.run([_problem(runner)])
    [ep] = RunStore.open(tmp_path / "two").episodes()
    assert ep.stop_reason == "max_turns" and ep.turns == 2


def test_only_the_first_of_several_calls_runs_and_every_call_gets_a_result(tmp_path):
    two = {"text": "", "tool_calls": [
        {"id": "x1", "name": "evaluate", "arguments": json.dumps({"code": FAST})},
        {"id": "x2", "name": "evaluate", "arguments": json.dumps({"code": SLOW})}]}
    evaluator = FakeEvaluator()
    runner, model = make_runner(tmp_path, [two, call("submit", FAST)], evaluator,
                                strategy={"kind": "agent", "turns": 4})
    runner.run([_problem(runner)])
    assert evaluator.calls == [FAST]
    sent = model.seen[-1][-2:]
    assert [(m.tool_call_id, m.content == NOT_RUN) for m in sent] == [("x1", False), ("x2", True)]


def test_a_run_budget_stops_the_agent_before_its_next_call(tmp_path):
    runner, model = make_runner(tmp_path, [call("evaluate", FAST)] * 5,
                                strategy={"kind": "agent", "turns": 8},
                                budget={"run": {"calls": 3}})
    summary = runner.run([_problem(runner)])
    assert summary.status == "budget" and summary.spend.calls == 3 and model.remaining == 2


def test_the_tools_offered_are_the_four_documented():
    assert [t.name for t in TOOLS] == ["evaluate", "profile", "problem", "submit"]
    assert all(t.parameters["type"] == "object" for t in TOOLS)


def test_the_agent_strategy_needs_the_full_context():
    from kloop.agent.config import ConfigError

    with pytest.raises(ConfigError, match="agent.context must be full"):
        make_config(strategy={"kind": "agent"}, agent={"context": "last"})
    with pytest.raises(ConfigError, match="does not take extended thinking"):
        make_config(strategy={"kind": "agent"},
                    model={"spec": "scripted:x", "thinking_budget_tokens": 2048})
    assert make_config(strategy={"kind": "agent"}).strategy.turns == 8


def test_problem_reports_the_sizes_judged(tmp_path):
    runner, _ = make_runner(tmp_path, [call("problem"), call("submit", FAST)],
                            strategy={"kind": "agent", "turns": 3},
                            problem_overrides={"L3/1": {"batch_size": 2}})
    runner.run([_problem(runner)])
    text = RunStore.open(tmp_path / "run").turns()[0].feedback
    assert "`batch_size = 2`" in text


class FailsOnce(FakeEvaluator):
    """The evaluator's infrastructure fails on its second evaluation, once."""

    def evaluate(self, problem, source):
        if len(self.calls) == 1 and not getattr(self, "failed", False):
            self.failed = True
            from kloop.agent.errors import EvalInfraError

            raise EvalInfraError("GPU worker lost (fake)")
        return super().evaluate(problem, source)


def test_a_step_cut_off_by_an_infra_fault_resumes_with_its_recorded_call(tmp_path):
    replies = [call("evaluate", WRONG), call("evaluate", FAST), call("submit", FAST)]
    evaluator = FailsOnce()
    runner, model = make_runner(tmp_path, replies, evaluator, strategy={"kind": "agent", "turns": 8})
    runner.run([_problem(runner)])
    store = RunStore.open(tmp_path / "run")
    assert [e.stop_reason for e in store.episodes()] == ["infra_error"]
    assert len(store.turns()) == 1
    assert [c.phase for c in store.calls()] == ["sent", "answered"] * 2
    [cut_off] = store.episodes()
    assert cut_off.unrecorded_spend.calls == 1 and cut_off.unrecorded_calls == [store.calls()[-1].call_id]
    # A new process: a fresh scripted model, restored past the replies on disk, calls included.
    again = ScriptedModel(replies)
    Runner(runner.cfg, store, again, evaluator).run([_problem(runner)])
    turns = store.turns()
    assert [(t.turn, t.tool.name, t.status) for t in turns] == [
        (1, "evaluate", "incorrect"), (2, "evaluate", "correct"), (3, "submit", "info")]
    assert again.remaining == 0 and len(again.seen) == 1  # only step 3 was asked
    assert store.summary().spend.calls == 3 and store.episodes()[-1].stop_reason == "submitted"
    # The reused call is accounted for by its step now, not by the resumed episode's record.
    resumed = store.episodes()[-1]
    assert resumed.unrecorded_calls == [] and resumed.unrecorded_spend.calls == 0
    assert turns[1].call_id == cut_off.unrecorded_calls[0]


def test_a_sweep_compares_the_agent_with_the_turn_loop_at_a_matched_budget(tmp_path):
    from kloop.agent.report.build import build_report
    from kloop.agent.sweep import run_sweep

    sweep = tmp_path / "sweep.yaml"
    sweep.write_text(f"""sweep:
  name: agent-vs-loop
  out: {tmp_path / 'exp'}
  base: {{problems: [L3/1], model: "scripted:unused", concurrency: 1,
          budget: {{run: {{calls: 3}}}}}}
  strategies: [{{turns: 8}}, {{kind: agent, turns: 8}}]
""")
    turn_replies = [reply(WRONG), reply(SLOW), reply(FAST), reply(FAST)]
    agent_replies = [call("problem"), call("evaluate", FAST), call("profile", FAST),
                     call("submit", FAST)]

    def components(cfg, problems):
        replies = agent_replies if cfg.strategy.kind == "agent" else turn_replies
        return ScriptedModel(replies), FakeEvaluator()

    outcomes = run_sweep(sweep, components=components)
    assert [(o.cell_id, o.status) for o in outcomes] == [
        ("base__1x8__base__base__seed0", "budget"), ("base__agent-1x8__base__base__seed0", "budget")]
    cells = tmp_path / "exp" / "cells"
    loop, agent = (RunStore.open(cells / o.cell_id).summary() for o in outcomes)
    assert loop.spend.calls == agent.spend.calls == 3
    assert loop.problems[0].best.runtime_ms == agent.problems[0].best.runtime_ms == 0.5
    report = build_report([tmp_path / "exp"], n_boot=0)
    rows = {r.label: r for r in report.runs}
    assert set(rows) == {o.cell_id for o in outcomes}
    assert all(r.metrics.fast_p[0].vs_eager.value == 1.0 for r in rows.values())


@pytest.mark.slow
def test_an_agent_run_through_the_real_evaluator_on_cpu(tmp_path):
    from kloop.agent.components import build_evaluator
    from kloop.agent.config import parse_layer, resolve
    from kloop.agent.run import DEMO_DIR

    demo = ScriptedModel.from_file(DEMO_DIR / "replies.yaml")
    correct, faster = [extract_code(demo.query([]).text, "stop") for _ in range(4)][2:]
    cfg = resolve([parse_layer(str(DEMO_DIR / "demo.yaml")),
                   {"model": {"spec": "scripted:x"}, "eval": {"device": "cpu"},
                    "strategy": {"kind": "agent", "turns": 6}}])
    problems = load_problems(cfg)
    store = RunStore.create(tmp_path / "run", cfg)
    model = ScriptedModel([call("problem"), call("evaluate", correct), call("profile", correct),
                           call("submit", faster)])
    Runner(cfg, store, model, build_evaluator(cfg, problems)).run(problems)
    turns = store.turns()
    assert [t.status for t in turns] == ["info", "correct", "info", "correct"], [
        (t.status, t.feedback[:300]) for t in turns]
    assert "`batch_size = 4`" in turns[0].feedback and "Hardware: cpu" in turns[0].feedback
    assert "not comparable with GPU timings" in turns[1].feedback
    assert "judged at step 2" in turns[2].feedback and "Profile of one forward pass" in turns[2].feedback
    [ep] = store.episodes()
    assert ep.stop_reason == "submitted"
    assert ep.best.turn == 4 and turns[3].eval.runtime_ms < turns[1].eval.runtime_ms
