"""Strategies spend the number of calls they promise; context policies decide what the model sees."""

from __future__ import annotations

import pytest
from agent_fakes import FakeEvaluator, kernel, make_config, make_runner, reply
from kloop.agent.components import load_problems
from kloop.agent.config import ConfigError


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
    problems = ["L3/1", "L3/2", "L3/3"]
    runner, _ = make_runner(tmp_path, _addressed(problems, 1, 2), problems=problems,
                            strategy={"turns": 2}, concurrency=3)
    assert runner.concurrency == 3
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
    problems = ["L3/1", "L3/2", "L3/3"]
    runner, _ = make_runner(tmp_path, _addressed(problems, 3, 1), evaluator=ev, problems=problems,
                            strategy={"kind": "best_of_n", "samples": 3}, concurrency=2)
    run(runner)
    assert len(ev.calls) == 9
    assert ev.peak == 2


def _addressed(problems, episodes, turns):
    """One reply per (problem, episode, turn), its kernel naming its own address."""
    return [{"at": {"problem": p, "episode": e, "turn": t},
             "text": reply(kernel(f"# for {p} {e} {t}", runtime_ms=1.0 + e / 10 + t / 100))}
            for p in problems for e in range(episodes) for t in range(1, turns + 1)]


def test_addressed_replies_reach_their_own_query_at_any_concurrency(tmp_path):
    """A scripted run of 3 problems x 2 samples x 2 turns, 4 episodes at once: every turn gets
    the reply addressed to it (ordered replies would go to whichever query came first)."""
    problems = ["L3/1", "L3/2", "L3/3"]
    runner, model = make_runner(tmp_path, _addressed(problems, 2, 2), problems=problems,
                                strategy={"turns": 2, "samples": 2}, concurrency=4)
    assert runner.concurrency == 4 and not model.ordered
    run(runner)
    turns = runner.store.turns()
    assert len(turns) == 12
    for t in turns:
        assert f"# for {t.problem_id} {t.episode} {t.turn}" in t.code, (t.problem_id, t.episode)


def test_a_resumed_addressed_run_continues_with_the_replies_of_its_turns(tmp_path):
    """Addressed replies need no position: a run whose script lacked some turns stops those
    episodes as infrastructure faults; resumed with the whole script, it asks for exactly the
    missing turns by address, at any concurrency."""
    from kloop.agent.models.scripted import ScriptedModel
    from kloop.agent.store import RunStore
    from kloop.agent.strategies import Runner

    replies = _addressed(["L3/1"], 2, 3)
    have = [r for r in replies if (r["at"]["episode"], r["at"]["turn"]) in {(0, 1), (0, 2), (1, 1)}]
    runner, _ = make_runner(tmp_path, have, strategy={"turns": 3, "samples": 2}, concurrency=2)
    run(runner)
    assert sorted((t.episode, t.turn) for t in runner.store.turns()) == [(0, 1), (0, 2), (1, 1)]
    store = RunStore.open(tmp_path / "run")
    Runner(runner.cfg, store, ScriptedModel(replies), FakeEvaluator()).run(load_problems(runner.cfg))
    turns = store.turns()
    assert sorted((t.episode, t.turn) for t in turns) == [(e, t) for e in (0, 1) for t in (1, 2, 3)]
    for t in turns:
        assert f"# for L3/1 {t.episode} {t.turn}" in t.code


def test_ordered_replies_run_one_episode_at_a_time(tmp_path, caplog):
    """Ordered replies with concurrency 3: the runner asks one query at a time (and says so),
    so problem i gets the replies in script order, never another problem's."""
    problems = ["L3/1", "L3/2", "L3/3"]
    replies = [reply(kernel(f"# reply {i}", runtime_ms=1.0)) for i in range(6)]
    runner, model = make_runner(tmp_path, replies, problems=problems, strategy={"turns": 2},
                                concurrency=3)
    assert model.ordered and runner.concurrency == 1
    assert "one at a time" in caplog.text
    run(runner)
    for t in runner.store.turns():
        i = problems.index(t.problem_id) * 2 + t.turn - 1
        assert f"# reply {i}" in t.code


@pytest.mark.parametrize(("entries", "match"), [
    ([{"text": "a", "at": {"problem": "L3/1", "episode": 0, "turn": 1}}, {"text": "b"}],
     "address every reply or none"),
    ([{"text": "a", "at": {"problem": "L3/1", "episode": 0, "turn": 1}},
      {"text": "b", "at": {"problem": "L3/1", "episode": 0, "turn": 1}}], "already answered"),
    ([{"text": "a", "at": {"problem": "L3/1", "episode": 0, "turn": 0}}], "greater than or equal"),
])
def test_a_badly_addressed_script_is_refused_with_the_entry_named(entries, match):
    from kloop.agent.models.scripted import ScriptedModel

    with pytest.raises(ValueError, match=match):
        ScriptedModel(entries)


def test_an_address_with_no_reply_ends_the_episode_as_an_infrastructure_fault(tmp_path):
    runner, _ = make_runner(tmp_path, _addressed(["L3/1"], 1, 1), strategy={"turns": 2})
    run(runner)
    (ep,) = runner.store.episodes()
    assert ep.turns == 1 and ep.stop_reason == "infra_error"
    assert "no scripted reply for L3/1 episode 0 turn 2" in ep.stop_detail
