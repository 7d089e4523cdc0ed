"""Strategies spend the number of calls they promise; context policies decide what the model sees."""

from __future__ import annotations

import pytest
from agent_fakes import kernel, make_config, make_runner, reply

from agent.components import load_problems
from agent.config import ConfigError


def run(runner):
    return runner.run(load_problems(runner.cfg))


@pytest.mark.parametrize(
    ("strategy", "calls", "episodes", "turns_each"),
    [
        ({"kind": "sequential", "turns": 3}, 3, 1, 3),
        ({"kind": "best_of_n", "samples": 4}, 4, 4, 1),
        ({"turns": 2, "samples": 3}, 6, 3, 2),  # inferred: grid
        ({"kind": "beam", "beam_width": 2, "expand": 2, "rounds": 3}, 12, 12, 1),
    ],
)
def test_each_strategy_makes_its_number_of_calls(tmp_path, strategy, calls, episodes, turns_each):
    replies = [reply(kernel(runtime_ms=1.0 + i / 10)) for i in range(calls)]
    runner, model = make_runner(tmp_path, replies, strategy=strategy)
    run(runner)
    eps = runner.store.episodes()
    assert model.remaining == 0 and len(model.seen) == calls
    assert len(eps) == episodes and {e.turns for e in eps} == {turns_each}
    assert sorted(e.episode for e in eps) == list(range(episodes))
    assert len({e.episode_key for e in eps}) == episodes


def test_beam_expands_the_best_kernels_with_their_history(tmp_path):
    # Round 0: four samples, runtimes 4, 1, 3, 2 ms: the kept parents are sample 1 then sample 3.
    round0 = [reply(kernel(runtime_ms=ms), f"sample {i}") for i, ms in enumerate([4, 1, 3, 2])]
    round1 = [reply(kernel(runtime_ms=0.5 + i), f"child {i}") for i in range(4)]
    runner, model = make_runner(tmp_path, round0 + round1,
                                strategy={"kind": "beam", "beam_width": 2, "expand": 2, "rounds": 2})
    run(runner)
    children = sorted((e for e in runner.store.episodes() if e.round == 1), key=lambda e: e.episode)
    first_keys = {e.episode: e.episode_key for e in runner.store.episodes() if e.round == 0}
    assert [c.parent.episode_key for c in children] == [first_keys[1]] * 2 + [first_keys[3]] * 2
    # A child's prompt continues its parent's trajectory: parent's reply, then its feedback.
    child_prompt = model.seen[4]
    assert [m.role for m in child_prompt] == ["system", "user", "assistant", "user"]
    assert child_prompt[2].content.startswith("sample 1")
    assert "Turn 2 of 2" in runner.store.turns()[4].feedback
    assert runner.best["L3/1"].reply.text.startswith("child 0")


@pytest.mark.parametrize(("context", "k", "assistant_msgs"), [("full", 2, 3), ("last_k", 2, 2), ("last", 2, 1)])
def test_context_policy_limits_the_history_shown(tmp_path, context, k, assistant_msgs):
    replies = [reply(kernel("BUG"), f"attempt {i}") for i in range(4)]
    runner, model = make_runner(tmp_path, replies, strategy={"turns": 4},
                                agent={"context": context, "context_k": k})
    run(runner)
    last_prompt = model.seen[3]
    shown = [m.content for m in last_prompt if m.role == "assistant"]
    assert len(shown) == assistant_msgs
    assert shown[-1].startswith("attempt 2")
    assert last_prompt[0].role == "system" and "1_MLP" in last_prompt[1].content
    assert last_prompt[-1].role == "user" and "Turn 3 of 4" in last_prompt[-1].content


def test_contradictory_strategy_settings_are_refused():
    with pytest.raises(ConfigError, match="use grid"):
        make_config(strategy={"kind": "sequential", "samples": 3})
    with pytest.raises(ConfigError, match="use grid"):
        make_config(strategy={"kind": "best_of_n", "turns": 3})


def test_problems_run_in_parallel_threads_with_one_store(tmp_path):
    replies = [reply(kernel(runtime_ms=1.0)) for _ in range(6)]
    runner, _ = make_runner(tmp_path, replies, problems=["L3/1", "L3/2", "L3/3"],
                            strategy={"turns": 2}, concurrency=3)
    summary = run(runner)
    assert [p.problem_id for p in summary.problems] == ["L3/1", "L3/2", "L3/3"]
    turns = runner.store.turns()
    for pid in ("L3/1", "L3/2", "L3/3"):
        assert sorted(t.turn for t in turns if t.problem_id == pid) == [1, 2]


def test_concurrency_bounds_evaluations_across_problems_and_samples(tmp_path):
    """concurrency=2 over 3 problems x 3 samples: never more than 2 evaluations at once
    (a pool over problems and another per wave used to allow 2 x 2)."""
    import threading
    import time

    from agent_fakes import FakeEvaluator

    class Counting(FakeEvaluator):
        def __init__(self):
            super().__init__()
            self.now = self.peak = 0
            self.guard = threading.Lock()

        def evaluate(self, problem, source):
            with self.guard:
                self.now += 1
                self.peak = max(self.peak, self.now)
            time.sleep(0.05)
            with self.guard:
                self.now -= 1
            return super().evaluate(problem, source)

    ev = Counting()
    replies = [reply(kernel(runtime_ms=1.0)) for _ in range(9)]
    runner, _ = make_runner(tmp_path, replies, evaluator=ev, problems=["L3/1", "L3/2", "L3/3"],
                            strategy={"kind": "best_of_n", "samples": 3}, concurrency=2)
    run(runner)
    assert len(ev.calls) == 9
    assert ev.peak == 2
