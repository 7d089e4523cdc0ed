"""Replay re-drives the loop with recorded replies and no provider; rescore and fork make new runs."""

from __future__ import annotations

import pytest
from agent_fakes import FakeEvaluator, kernel, make_runner, reply
from kloop.agent import replay as replay_lib
from kloop.agent.components import load_problems
from kloop.agent.models.base import Message, ModelReply
from kloop.agent.models.replay import ReplayModel
from kloop.agent.models.scripted import ScriptedModel
from kloop.agent.store import RunStore

TRAJECTORY = [
    reply(kernel("SYNTAX")), "no code this time", reply(kernel("BUG")),
    reply(kernel(runtime_ms=1.5)), reply(kernel(runtime_ms=0.6)),
]


def recorded_run(tmp_path, replies=TRAJECTORY, **layer):
    layer.setdefault("strategy", {"turns": len(replies)})
    runner, _ = make_runner(tmp_path, replies, **layer)
    runner.run(load_problems(runner.cfg))
    return runner.store


class StrictEvaluator(FakeEvaluator):
    """A stricter evaluator of tomorrow: kernels slower than 1 ms are now rejected."""

    def evaluate(self, problem, source):
        result = super().evaluate(problem, source)
        if result.correct and result.runtime_ms > 1.0:
            return result.model_copy(update={"status": "rejected", "timing": None})
        return result


def test_replay_reproduces_the_turns_without_any_provider(tmp_path):
    source = recorded_run(tmp_path)
    report = replay_lib.replay(source.root, tmp_path / "again", evaluator=FakeEvaluator())
    new = RunStore.open(tmp_path / "again")
    old_turns, new_turns = source.turns(), new.turns()
    assert [t.reply.text for t in new_turns] == [t.reply.text for t in old_turns]
    assert [t.status for t in new_turns] == [t.status for t in old_turns]
    assert [t.messages for t in new_turns] == [t.messages for t in old_turns]
    assert [t.feedback for t in new_turns] == [t.feedback for t in old_turns]
    assert report.differences == [] and report.turns_compared == 5 and report.replies_unused == 0
    record = new.config_record()
    assert record.kind == "replay" and record.config.model.spec == f"replay:{source.root}"
    assert (tmp_path / "again" / "replay_report.json").exists()


def test_replay_reports_turns_whose_verdict_changed(tmp_path):
    source = recorded_run(tmp_path)
    report = replay_lib.replay(source.root, tmp_path / "again", evaluator=StrictEvaluator())
    assert [(d.turn, d.before, d.after) for d in report.differences] == [(4, "correct", "rejected")]
    # The trajectory still follows the recorded replies although the feedback changed.
    assert len(RunStore.open(tmp_path / "again").turns()) == 5


def test_replay_model_serves_identical_prompts_in_recorded_order():
    opening = [Message(role="system", content="s"), Message(role="user", content="task")]
    recorded = [(opening, ScriptedModel(["first"]).query([])),
                (opening, ScriptedModel(["second"]).query([]))]
    model = ReplayModel(recorded)
    assert model.query(opening).text == "first"
    assert model.query(opening).text == "second"
    assert model.remaining == 0


def test_replay_model_serves_a_turn_whose_templates_changed_by_its_address_and_history():
    """A run recorded by an older kloop (other system, task or feedback text) replays: the reply
    recorded at the same problem, episode and turn after the same model replies is served."""
    from kloop.agent.errors import ScriptExhausted
    from kloop.agent.models.base import Address, Message

    def asked(system: str, *replies: str) -> list[Message]:
        msgs = [Message(role="system", content=system), Message(role="user", content="task")]
        for r in replies:
            msgs += [Message(role="assistant", content=r), Message(role="user", content="fb")]
        return msgs

    one, two = (ModelReply(text=t, usage=None, cost_usd=None, finish_reason="stop", latency_s=0.0,
                           model="m", raw={}) for t in ("first", "second"))
    at1, at2 = Address(problem="L3/1", episode=0, turn=1), Address(problem="L3/1", episode=0, turn=2)
    model = ReplayModel([(asked("old"), one), (asked("old", "first"), two)],
                        turns={0: at1, 1: at2})
    assert model.query_at(asked("new"), at1) is one
    with pytest.raises(ScriptExhausted):  # the same turn after other replies of the model
        model.query_at(asked("new", "another"), at2)
    assert model.query_at(asked("new", "first"), at2) is two
    with pytest.raises(ScriptExhausted):  # without an address, the prompt must match
        ReplayModel([(asked("old"), one)], turns={0: at1}).query(asked("new"))


def test_rescore_reevaluates_every_kernel_into_a_new_run(tmp_path):
    source = recorded_run(tmp_path)
    ev = StrictEvaluator()
    report = replay_lib.rescore(source.root, tmp_path / "rescored", evaluator=ev)
    assert len(ev.calls) == 4  # every logged kernel; the reply without code is not evaluated
    new = RunStore.open(tmp_path / "rescored")
    assert [t.status for t in new.turns()] == ["compile_error", "format_error", "incorrect",
                                                "rejected", "correct"]
    assert [(d.turn, d.after) for d in report.differences] == [(4, "rejected")]
    assert "rejected" in new.turns()[3].feedback
    assert [t.reply for t in new.turns()] == [t.reply for t in source.turns()]
    ep = new.episodes()[0]
    assert ep.best.turn == 5 and ep.stop_reason == "max_turns"
    assert new.config_record().kind == "rescore"
    assert source.turns()[3].status == "correct"  # the source run is untouched


def test_fork_continues_each_trajectory_with_another_model(tmp_path):
    source = recorded_run(tmp_path, replies=[reply(kernel("BUG"), "old 1"), reply(kernel("BUG"), "old 2"),
                                             reply(kernel("BUG"), "old 3")])
    other = ScriptedModel([reply(kernel(runtime_ms=0.4), "new 1"), reply(kernel(runtime_ms=0.3), "new 2")])
    runner = replay_lib.fork(source.root, tmp_path / "forked", at_turn=1,
                             layers=[{"strategy": {"turns": 2}}], model=other, evaluator=FakeEvaluator())
    new = runner.store
    first_prompt = other.seen[0]
    assert [m.content.split("\n")[0] for m in first_prompt if m.role == "assistant"] == ["old 1"]
    assert "Turn 2 of 3" in new.turns()[0].feedback
    ep = new.episodes()[0]
    assert ep.parent.turn == 1 and ep.turns == 2 and ep.best.runtime_ms == 0.3
    assert new.config_record().fork_at == 1
    # Its turns 1-2 are turns 2-3 of what the model saw ("Turn 2 of 3"), and say so; its root
    # node keeps the source's episode number and names the source node it continues.
    from io import StringIO

    from kloop.agent.report.show import show
    from rich.console import Console

    assert [(t.turn, t.position) for t in new.turns()] == [(1, 2), (2, 3)]
    out = StringIO()
    show(new.root, Console(file=out, width=200), problem="L3/1")
    assert "turn 1 (turn 2 of the trajectory the model saw; 1 inherited)" in out.getvalue()
    out = StringIO()
    show(new.root, Console(file=out, width=200), tree=True)
    assert "0:1 forked from source 0:1 correct" in out.getvalue()


def test_replay_provider_by_name_answers_a_recorded_prompt(tmp_path):
    from kloop.agent.models import ModelConfig, get_model

    source = recorded_run(tmp_path)
    model = get_model(f"replay:{source.root}", ModelConfig(spec=f"replay:{source.root}"))
    first = source.turns()[0]
    assert model.query(first.messages).text == first.reply.text
    assert model.remaining == 4


class OverlapEvaluator(FakeEvaluator):
    """Counts how many evaluations run at once; the first one is the slowest."""

    def __init__(self):
        super().__init__()
        self.now = self.most = 0

    def evaluate(self, problem, source):
        import time

        with self._lock:
            self.now += 1
            self.most = max(self.most, self.now)
            first = len(self.calls) == 0
        time.sleep(0.3 if first else 0.05)
        try:
            return super().evaluate(problem, source)
        finally:
            with self._lock:
                self.now -= 1


def test_rescore_judges_kernels_concurrently_and_records_them_in_order(tmp_path):
    source = recorded_run(tmp_path)
    ev = OverlapEvaluator()
    replay_lib.rescore(source.root, tmp_path / "rescored", evaluator=ev, concurrency=3)
    assert ev.most > 1  # `concurrency` evaluations at once, not one after another
    new = RunStore.open(tmp_path / "rescored")
    assert [(t.episode, t.turn) for t in new.turns()] == [(t.episode, t.turn)
                                                          for t in source.turns()]
    assert [t.status for t in new.turns()] == [t.status for t in source.turns()]
