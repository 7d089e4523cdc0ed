"""The best kernel under noise: a new kernel replaces the best so far only when its speedup
interval clears the incumbent's; a close call keeps the incumbent and is recorded on its turn."""

from __future__ import annotations

import pytest
from agent_fakes import FakeEvaluator, kernel, make_config, make_runner, reply, with_interval

from kloop.agent.budget import Spend
from kloop.agent.components import load_problems
from kloop.agent.models.base import ModelReply, Usage
from kloop.agent.models.scripted import ScriptedModel
from kloop.agent.records import TurnRecord
from kloop.agent.store import RunStore
from kloop.agent.strategies import Runner
from kloop.agent.tally import best_turn, challenge
from kloop.agent.tree import Tree, draw, node_value
from kloop.problems.registry import get_problem

PROBLEM = get_problem("L3/1")


def run_turns(tmp_path, bodies: list[str], **layer) -> tuple[list[TurnRecord], object]:
    """One episode of the real loop over `bodies`, one reply a turn."""
    runner, _ = make_runner(tmp_path, [reply(b) for b in bodies], strategy={"turns": len(bodies)},
                            **layer)
    summary = runner.run(load_problems(runner.cfg))
    return runner.store.turns(), summary


def test_a_faster_kernel_inside_the_noise_keeps_the_incumbent_and_a_clear_win_replaces_it(tmp_path):
    # Speedups vs eager (2 ms): 2.0x [1.9, 2.1]; 2.2x [2.05, 2.35] overlaps it (the point rule
    # would take it); 2.5x [2.3, 2.7] clears 2.1, the incumbent's high end.
    turns, summary = run_turns(tmp_path, [kernel(runtime_ms=1.0, ci=(1.9, 2.1)),
                                          kernel(runtime_ms=0.9090909, ci=(2.05, 2.35)),
                                          kernel(runtime_ms=0.8, ci=(2.3, 2.7))])
    assert turns[0].best_decision is None  # the first correct kernel: nothing to compare
    close = turns[1].best_decision
    assert close.outcome == "kept_too_close" and close.rule == "interval" and close.baseline == "eager"
    assert close.detail == "kept: too close to call"
    assert (close.incumbent.turn, close.challenger.turn) == (1, 2)
    assert (close.incumbent_interval.low, close.incumbent_interval.high) == (1.9, 2.1)
    assert (close.challenger_interval.low, close.challenger_interval.high, close.challenger_interval.rounds) \
        == (2.05, 2.35, 10)
    assert best_turn(turns[:2]) is turns[0]
    win = turns[2].best_decision
    assert win.outcome == "replaced" and win.incumbent.turn == 1 and win.challenger.turn == 3
    ep = (tmp_path / "run" / "episodes.jsonl").read_text()
    assert '"best_decision"' not in ep  # decisions live on the turns
    episode = summary.problems[0]
    assert episode.best.turn == 3 and episode.best.speedup_interval.low == 2.3
    assert (tmp_path / "run" / "best" / "1_MLP.py").read_text() == turns[2].code


def test_a_kernel_slower_beyond_the_noise_is_kept_out():
    fast = FakeEvaluator().evaluate(PROBLEM, kernel(runtime_ms=1.0, ci=(1.9, 2.1)))
    slow = FakeEvaluator().evaluate(PROBLEM, kernel(runtime_ms=1.5, ci=(1.2, 1.4)))
    decision = challenge(turn(fast, 1), turn(slow, 2))
    assert (decision.outcome, decision.detail) == ("kept", "kept: slower beyond the noise")


def test_without_intervals_the_lower_runtime_wins_and_the_record_says_which_rule(tmp_path):
    turns, summary = run_turns(tmp_path, [kernel(runtime_ms=1.0), kernel(runtime_ms=0.99),
                                          kernel(runtime_ms=0.995, ci=(2.0, 2.02))])
    assert turns[1].best_decision.outcome == "replaced" and turns[1].best_decision.rule == "point"
    # One side without an interval: the point rule, even though the challenger has one.
    third = turns[2].best_decision
    assert (third.outcome, third.rule) == ("kept", "point") and third.incumbent.turn == 2
    assert "point rule" in third.detail and third.challenger_interval is None
    assert summary.problems[0].best.turn == 2


def test_a_recorded_decision_is_honoured_and_one_against_another_incumbent_is_not(tmp_path):
    turns, _ = run_turns(tmp_path, [kernel(runtime_ms=1.0, ci=(1.9, 2.1)),
                                    kernel(runtime_ms=0.8, ci=(2.3, 2.7))])
    assert best_turn(turns) is turns[1]
    # As a head-to-head re-measurement could record it: the incumbent stays after all.
    settled = turns[1].model_copy(update={"best_decision": turns[1].best_decision.model_copy(
        update={"outcome": "kept_too_close"})})
    assert best_turn([turns[0], settled]) is turns[0]
    elsewhere = turns[1].best_decision.incumbent.model_copy(update={"turn": 7})
    stale = turns[1].model_copy(update={"best_decision": turns[1].best_decision.model_copy(
        update={"outcome": "kept_too_close", "incumbent": elsewhere})})
    assert best_turn([turns[0], stale]) is stale


def test_a_resumed_run_keeps_the_decisions_its_turns_recorded(tmp_path):
    bodies = [kernel(runtime_ms=1.0, ci=(1.9, 2.1)), kernel(runtime_ms=0.8, ci=(2.3, 2.7))]
    turns, first = run_turns(tmp_path, bodies)
    assert first.problems[0].best.turn == 2
    # As a head-to-head re-measurement could have recorded it: turn 2 did not replace turn 1.
    path = tmp_path / "run" / "turns.jsonl"
    path.write_text(path.read_text().replace('"outcome":"replaced"', '"outcome":"kept_too_close"'))
    runner = Runner(make_config(strategy={"turns": 2}), RunStore.open(tmp_path / "run"),
                    ScriptedModel([]), FakeEvaluator())
    assert runner.best["L3/1"].turn == 1


def turn(result, n: int, episode: int = 0) -> TurnRecord:
    """A turn record holding `result`, as the loop writes it."""
    r = ModelReply(text="t", usage=Usage(), cost_usd=0.0, finish_reason="stop", latency_s=0.0,
                   model="m", raw={})
    return TurnRecord(run_id="r", episode_key=f"k{episode}", episode=episode, problem_id=PROBLEM.id,
                      problem_stem=PROBLEM.stem, turn=n, messages=[], reply=r, code="x",
                      code_sha256="h", kernel_path=f"kernels/1_MLP/{episode}-{n}.py", eval=result,
                      feedback="", spend=Spend(), started_at="t", finished_at="t")


def test_tree_values_use_the_low_end_of_the_interval_and_the_drawing_shows_it():
    ev = FakeEvaluator().evaluate(PROBLEM, kernel(runtime_ms=1.0))  # 2x vs eager
    plain, noisy = turn(ev, 1), turn(with_interval(ev, 1.2, 2.8), 1, episode=1)
    assert node_value(plain) == 0.5 + 0.5 * 2.0 / 3.0
    assert node_value(noisy) == 0.5 + 0.5 * 1.2 / 2.2
    tight = turn(with_interval(ev.model_copy(update={"speedup_vs_eager": 1.8}), 1.75, 1.85), 1, episode=2)
    assert node_value(tight) > node_value(noisy)  # a surer 1.8x beats a noisy 2x
    lines = draw(Tree([noisy, tight]).rows(), "tree")
    assert "1:1 correct 2x [1.2, 2.8] (value 0.77)" in lines[1]
    # Overlapping intervals: the first stays the best.
    assert lines[1].endswith("<- best") and not lines[2].endswith("<- best")


class HeadToHeadEvaluator(FakeEvaluator):
    """A fake evaluator that also offers a head-to-head; `ratio` and `interval` are what it
    measures (the incumbent's time over the challenger's)."""

    def __init__(self, ratio: float, interval: tuple[float, float]):
        super().__init__(held_s=0.1)
        self.ratio, self.interval, self.compared = ratio, interval, []

    def head_to_head(self, problem, challenger, incumbent):
        from kloop.evaluator.common.result import HeadToHead

        self.compared.append((challenger, incumbent))
        result = self.evaluate(problem, challenger)
        return result.model_copy(update={"head_to_head": HeadToHead(
            ratio=self.ratio, low=self.interval[0], high=self.interval[1], rounds=10,
            incumbent_sha256="h")})


def test_a_close_call_is_settled_head_to_head_and_its_seconds_are_charged(tmp_path):
    bodies = [kernel(runtime_ms=1.0, ci=(1.9, 2.1)), kernel(runtime_ms=0.9090909, ci=(2.05, 2.35))]
    wins = HeadToHeadEvaluator(ratio=1.08, interval=(1.05, 1.11))
    runner, _ = make_runner(tmp_path / "a", [reply(b) for b in bodies], evaluator=wins,
                            strategy={"turns": 2})
    runner.run(load_problems(runner.cfg))
    turns = runner.store.turns()
    d = turns[1].best_decision
    assert d.outcome == "replaced" and d.head_to_head.ratio == 1.08 and "head to head" in d.detail
    assert wins.compared == [(turns[1].code, turns[0].code)]  # challenger first, then incumbent
    assert d.head_to_head_s is not None and turns[1].spend.eval_s >= d.head_to_head_s
    # Its device holds too: the challenger's evaluation and the head-to-head's.
    assert d.head_to_head_gpu_s == pytest.approx(0.1)
    assert turns[1].spend.gpu_s == pytest.approx(0.1 + d.head_to_head_gpu_s)
    assert best_turn(turns) is turns[1]
    # The same close call where the head-to-head is itself too close keeps the incumbent.
    tie = HeadToHeadEvaluator(ratio=1.01, interval=(0.98, 1.04))
    runner, _ = make_runner(tmp_path / "b", [reply(b) for b in bodies], evaluator=tie,
                            strategy={"turns": 2})
    runner.run(load_problems(runner.cfg))
    turns = runner.store.turns()
    assert turns[1].best_decision.outcome == "kept_too_close"
    assert turns[1].best_decision.detail == "kept: too close to call (head to head too close)"
    assert best_turn(turns) is turns[0]
