"""The condensing context policies: `digest` (from the records) and `summary` (a recorded model
call, charged to the budget, reused by replay and fork)."""

from __future__ import annotations

import pytest
from agent_fakes import FakeEvaluator, kernel, make_runner, reply, run_kloop
from kloop.agent import replay as replay_lib
from kloop.agent.components import load_problems
from kloop.agent.config import AgentConfig
from kloop.agent.context import condensed_count, digest_rows
from kloop.agent.models.scripted import ScriptedModel
from kloop.agent.prompts import PromptSet
from kloop.agent.store import RunStore

REPLIES = [reply(kernel("SYNTAX"), "turn 1 plan"), "no code at all", reply(kernel("BUG"), "turn 3 plan"),
           reply(kernel("CRASH"), "turn 4 plan"), reply(kernel(runtime_ms=1.0), "turn 5 plan"),
           reply(kernel(runtime_ms=0.5), "turn 6 plan")]


def run(tmp_path, replies, run_id="run", **layer):
    runner, model = make_runner(tmp_path, replies, run_id=run_id, **layer)
    runner.run(load_problems(runner.cfg))
    return runner, model


def shown_replies(messages) -> list[str]:
    return [m.content.split("\n")[0] for m in messages if m.role == "assistant"]


@pytest.mark.parametrize(("n", "k", "condensed"), [
    (0, 2, 0), (3, 2, 0), (4, 2, 2), (5, 2, 2), (6, 2, 4), (1, 1, 0), (2, 1, 1), (5, 1, 4), (8, 3, 3),
])
def test_older_turns_are_condensed_in_steps_of_k(n, k, condensed):
    assert condensed_count(n, AgentConfig(context="digest", context_k=k)) == condensed
    assert condensed_count(n, AgentConfig(context="last_k", context_k=k)) == 0


def test_the_digest_lists_every_condensed_turn_and_is_the_same_from_the_records(tmp_path):
    runner, model = run(tmp_path, REPLIES[:5], strategy={"turns": 5},
                        agent={"context": "digest", "context_k": 1})
    turns = runner.store.turns()
    last = model.seen[4]  # before turn 5: turns 1-3 condensed, turn 4 in full
    assert shown_replies(last) == ["turn 4 plan"]
    digest = last[2].content
    assert last[2].role == "user" and digest.startswith("Your turns 1 to 3 in brief")
    rows = [line for line in digest.splitlines() if line.startswith("| ") and line[2].isdigit()]
    assert [r.split(" | ")[:2] for r in rows] == [["| 1", "compile_error"], ["| 2", "format_error"],
                                                  ["| 3", "incorrect"]]
    assert "line 2: invalid syntax" in rows[0] and "no fenced ```python code block" in rows[1]
    assert "5 of 5 checks failed, max abs error 0.5" in rows[2]
    # Rendered again from the records on disk, the digest is the same text.
    again = PromptSet().render("context_digest", rows=digest_rows(turns[:3]))
    assert again == digest == turns[4].messages[2].content
    assert model.seen[1][2].role == "assistant"  # turn 2: one earlier turn, nothing condensed
    assert all(t.summary is None and t.spend.calls == 1 for t in turns)


def summary(turn: int, text: str, cost: float = 0.01) -> dict:
    return {"at": {"problem": "L3/1", "episode": 0, "turn": turn, "call": "summary"}, "text": text,
            "usage": {"input_tokens": 500, "output_tokens": 40}, "cost_usd": cost}


def addressed(replies: list[str], summaries: dict[int, str]) -> list[dict]:
    turns = [{"at": {"problem": "L3/1", "episode": 0, "turn": i}, "text": r,
              "usage": {"input_tokens": 100, "output_tokens": 10}, "cost_usd": 0.001}
             for i, r in enumerate(replies, start=1)]
    return turns + [summary(t, s) for t, s in summaries.items()]


SUMMARIZED = addressed(REPLIES[:4], {3: "S1: turn 1 failed to compile", 4: "S2: 1 and 2 failed"})


def test_the_summary_call_is_recorded_on_its_turn_and_charged(tmp_path):
    runner, model = run(tmp_path, SUMMARIZED, strategy={"turns": 4}, agent={"context": "summary", "context_k": 1})
    t = runner.store.turns()
    assert [x.summary is not None for x in t] == [False, False, True, True]
    s3, s4 = t[2].summary, t[3].summary
    assert (s3.covers, s3.reply.text, s3.text, s3.fault) == (1, "S1: turn 1 failed to compile",
                                                             "S1: turn 1 failed to compile", None)
    # The summary stands for turn 1; turn 2 follows in full.
    assert "S1: turn 1 failed to compile" in t[2].messages[2].content
    assert shown_replies(t[2].messages) == ["no code at all"]
    # Each summary call gets the previous summary and only the turns it did not cover.
    assert "turn 1 plan" in s3.messages[0].content and "no code at all" not in s3.messages[0].content
    assert "S1: turn 1 failed" in s4.messages[0].content and "no code at all" in s4.messages[0].content
    assert "turn 1 plan" not in s4.messages[0].content
    # Charged: two calls on the turn, its tokens and dollars counted like the query's.
    assert (t[2].spend.calls, t[2].spend.input_tokens, t[2].spend.cost_usd) == (2, 600, pytest.approx(0.011))
    assert runner.run_meter.spent().calls == 6 and runner.store.episodes()[0].spend.calls == 6
    assert runner.store.summary().spend.cost_usd == pytest.approx(4 * 0.001 + 2 * 0.01)
    shown = run_kloop("show", runner.store.root, "-p", "L3/1", "--turn", 4)
    assert shown.exit_code == 0 and "summary call before this turn: turns 1-2" in shown.stdout
    assert "S2: 1 and 2 failed" in shown.stdout


def test_summary_calls_count_against_the_budget(tmp_path):
    runner, model = run(tmp_path, SUMMARIZED, strategy={"turns": 4}, agent={"context": "summary", "context_k": 1},
                        budget={"episode": {"calls": 4}})
    (ep,) = runner.store.episodes()
    assert ep.turns == 3 and ep.stop_reason == "budget" and len(model.seen) == 4


def test_an_unusable_summary_is_a_model_fault_and_the_digest_stands_in(tmp_path):
    replies = addressed(REPLIES[:3], {3: ""})
    runner, _ = run(tmp_path, replies, strategy={"turns": 3}, agent={"context": "summary", "context_k": 1})
    t3 = runner.store.turns()[2]
    assert t3.summary.fault.type == "UnusableSummary" and "empty reply" in t3.summary.fault.message
    assert t3.summary.text.startswith("Your turns 1 to 1 in brief") and t3.summary.text in t3.messages[2].content
    assert runner.store.episodes()[0].stop_reason == "max_turns"


def test_a_failed_summary_call_ends_the_episode_as_an_infrastructure_fault(tmp_path):
    replies = addressed(REPLIES[:3], {})  # no summary scripted for turn 3
    runner, _ = run(tmp_path, replies, strategy={"turns": 3}, agent={"context": "summary", "context_k": 1})
    (ep,) = runner.store.episodes()
    assert ep.turns == 2 and ep.stop_reason == "infra_error"
    assert "turn 3 (summary call)" in ep.stop_detail


class StricterEvaluator(FakeEvaluator):
    """Tomorrow's evaluator: wrong outputs now count as runtime errors (other feedback)."""

    def evaluate(self, problem, source):
        result = super().evaluate(problem, source)
        return result.model_copy(update={"status": "runtime_error"}) if result.status == "incorrect" else result


@pytest.mark.parametrize("evaluator", [FakeEvaluator, StricterEvaluator])
def test_replay_serves_the_recorded_summaries(tmp_path, evaluator):
    """Same verdicts: every prompt is the same. Changed verdicts: the summary prompt quotes other
    feedback, and the summary recorded at that turn is served all the same."""
    replies = addressed(REPLIES[:5], {3: "S1", 4: "S2", 5: "S3"})
    source, _ = run(tmp_path, replies, strategy={"turns": 5}, agent={"context": "summary", "context_k": 1})
    report = replay_lib.replay(source.store.root, tmp_path / "again", evaluator=evaluator())
    old, new = source.store.turns(), RunStore.open(tmp_path / "again").turns()
    assert report.replies_unused == 0 and len(new) == 5
    assert [t.summary.text for t in new if t.summary] == ["S1", "S2", "S3"]
    assert [t.reply.text for t in new] == [t.reply.text for t in old]
    same = evaluator is FakeEvaluator
    assert ([t.messages for t in new] == [t.messages for t in old]) == same
    assert ([t.summary.messages for t in new if t.summary] == [t.summary.messages for t in old if t.summary]) == same


def test_a_fork_reuses_the_summary_in_its_trajectory_and_makes_the_next_one(tmp_path):
    """k=2: the source's turn 5 carries a summary of turns 1-2 (turn 6 reuses it). Forked after
    turn 5, the first turn needs no call; the second condenses turns 3-4 onto it."""
    source_replies = [*REPLIES[:4], "S12: turns 1 and 2", *REPLIES[4:6]]  # ordered: the summary before turn 5
    source, _ = run(tmp_path, source_replies, strategy={"turns": 6}, agent={"context": "summary", "context_k": 2})
    t = source.store.turns()
    assert [x.summary.covers if x.summary else None for x in t] == [None] * 4 + [2, None]
    assert "S12: turns 1 and 2" in t[5].messages[2].content  # reused, not asked again

    other = ScriptedModel([reply(kernel(runtime_ms=0.4), "fork 1"), "S34: turns 3 and 4",
                           reply(kernel(runtime_ms=0.3), "fork 2")])
    fork = replay_lib.fork(source.store.root, tmp_path / "fork", at_turn=5,
                           layers=[{"strategy": {"turns": 2}}], model=other, evaluator=FakeEvaluator())
    f1, f2 = fork.store.turns()
    assert f1.summary is None and "S12: turns 1 and 2" in f1.messages[2].content
    assert shown_replies(f1.messages) == ["turn 3 plan", "turn 4 plan", "turn 5 plan"]
    assert f2.summary.covers == 4 and f2.summary.text == "S34: turns 3 and 4"
    prompt = f2.summary.messages[0].content
    assert "S12: turns 1 and 2" in prompt and "turn 3 plan" in prompt and "turn 4 plan" in prompt
    assert "turn 5 plan" not in prompt
    assert "S34: turns 3 and 4" in f2.messages[2].content
    assert shown_replies(f2.messages) == ["turn 5 plan", "fork 1"]
    assert f2.spend.calls == 2 and fork.store.episodes()[0].spend.calls == 3


def test_a_fork_with_a_larger_k_uses_the_summary_that_fits(tmp_path):
    """Source k=1 summarised before each of turns 3-6 (turns 1-1 ... 1-4). A fork after turn 6
    with k=3 condenses turns 1-3: the source's summary of 1-3 (on turn 5) fits, that of 1-4
    does not."""
    ordered = [REPLIES[0], REPLIES[1]] + [x for i in range(2, 6) for x in (f"S{i - 1}", REPLIES[i])]
    source, _ = run(tmp_path, ordered, strategy={"turns": 6}, agent={"context": "summary", "context_k": 1})
    assert [t.summary.covers for t in source.store.turns() if t.summary] == [1, 2, 3, 4]
    other = ScriptedModel([reply(kernel(runtime_ms=0.4), "fork 1")])
    fork = replay_lib.fork(source.store.root, tmp_path / "fork", at_turn=6,
                           layers=[{"strategy": {"turns": 1}, "agent": {"context_k": 3}}], model=other,
                           evaluator=FakeEvaluator())
    (f1,) = fork.store.turns()
    assert f1.summary is None and "S3" in f1.messages[2].content and "S4" not in f1.messages[2].content
    assert shown_replies(f1.messages) == ["turn 4 plan", "turn 5 plan", "turn 6 plan"]
