"""Budget limits stop episodes and runs at the right point, in each unit."""

from __future__ import annotations

import pytest
from agent_fakes import FakeEvaluator, kernel, make_runner, reply

from kloop.agent.components import load_problems


def priced(cost: float | None = 0.01, tokens: int = 1000, out: int = 100, reasoning: int = 0) -> dict:
    return {"text": reply(kernel("BUG")), "cost_usd": cost,
            "usage": {"input_tokens": tokens, "output_tokens": out, "reasoning_tokens": reasoning}}


def run(runner):
    return runner.run(load_problems(runner.cfg))


@pytest.mark.parametrize(
    ("limits", "turns_done", "unit"),
    [
        ({"calls": 2}, 2, "calls"),
        ({"input_tokens": 2500}, 3, "input_tokens"),  # 1000 per call: stops once 3000 >= 2500
        ({"total_tokens": 2200}, 2, "total_tokens"),  # 1100 per call
        ({"reasoning_tokens": 100}, 2, "reasoning_tokens"),
        ({"cost_usd": 0.035}, 4, "cost_usd"),
    ],
)
def test_episode_limit_stops_before_the_next_call(tmp_path, limits, turns_done, unit):
    runner, model = make_runner(tmp_path, [priced(reasoning=50) for _ in range(8)],
                                strategy={"turns": 8}, budget={"episode": limits})
    run(runner)
    ep = runner.store.episodes()[0]
    assert ep.stop_reason == "budget" and ep.turns == turns_done
    assert ep.stop_detail.startswith(f"episode {unit} limit reached")
    assert len(model.seen) == turns_done


def test_evaluation_seconds_limit(tmp_path):
    runner, _ = make_runner(tmp_path, [priced() for _ in range(4)], FakeEvaluator(delay_s=0.2),
                            strategy={"turns": 4}, budget={"episode": {"eval_s": 0.3}})
    run(runner)
    ep = runner.store.episodes()[0]
    assert (ep.turns, ep.stop_reason) == (2, "budget") and "eval_s" in ep.stop_detail
    assert ep.spend.eval_s >= 0.4


def test_gpu_seconds_limit_counts_the_device_holds_not_the_wall(tmp_path):
    """GPU-seconds are what the evaluations held the device for (`EvalResult.held_s`), whatever
    their wall time: here 0.2 s of holds in evaluations of about no wall time."""
    runner, _ = make_runner(tmp_path, [priced() for _ in range(4)], FakeEvaluator(held_s=0.2),
                            strategy={"turns": 4}, budget={"episode": {"gpu_s": 0.3}})
    run(runner)
    ep = runner.store.episodes()[0]
    assert (ep.turns, ep.stop_reason) == (2, "budget") and "gpu_s" in ep.stop_detail
    assert ep.spend.gpu_s == pytest.approx(0.4) and ep.spend.eval_s < 0.3
    turns = runner.store.turns()
    assert [t.spend.gpu_s for t in turns] == pytest.approx([0.2, 0.2])


def test_run_limit_stops_the_running_episode_and_skips_the_rest(tmp_path):
    runner, model = make_runner(tmp_path, [priced() for _ in range(12)],
                                strategy={"turns": 3, "samples": 4}, budget={"run": {"cost_usd": 0.05}})
    summary = run(runner)
    eps = sorted(runner.store.episodes(), key=lambda e: e.episode)
    assert [e.turns for e in eps] == [3, 2]
    assert eps[1].stop_reason == "budget" and eps[1].stop_detail.startswith("run cost_usd")
    assert len(model.seen) == 5 and runner.skipped == 2
    assert summary.status == "budget" and summary.spend.cost_usd == pytest.approx(0.05)


def test_unknown_cost_cannot_pass_a_dollar_limit(tmp_path):
    runner, _ = make_runner(tmp_path, [priced(cost=None) for _ in range(3)],
                            strategy={"turns": 3}, budget={"episode": {"cost_usd": 1.0}})
    run(runner)
    ep = runner.store.episodes()[0]
    assert ep.turns == 1 and ep.stop_reason == "budget" and "unknown cost" in ep.stop_detail
    assert ep.spend.unpriced_calls == 1


def test_unknown_usage_is_not_zero_tokens():
    from kloop.agent.budget import Meter, Spend
    from kloop.agent.config import Limits
    from kloop.agent.models.base import ModelReply, Usage

    def reply(usage):
        return ModelReply(text="", usage=usage, cost_usd=None, finish_reason=None, latency_s=0.0,
                          model="m", raw={})

    known = Spend.of_reply(reply(Usage(input_tokens=10, output_tokens=5)))
    unknown = Spend.of_reply(reply(None))
    assert (known.total_tokens, known.unmetered_calls) == (15, 0)
    assert (unknown.calls, unknown.total_tokens, unknown.unmetered_calls) == (1, 0, 1)
    meter = Meter(Limits(total_tokens=1000), "episode")
    meter.charge(unknown)
    assert meter.exceeded() == ("episode total_tokens limit cannot be enforced: 1 call(s) of "
                                "unknown token usage")


def test_wall_clock_limit(tmp_path):
    runner, _ = make_runner(tmp_path, [priced() for _ in range(3)],
                            strategy={"turns": 3}, budget={"episode": {"wall_s": 0.0}})
    run(runner)
    ep = runner.store.episodes()[0]
    assert ep.turns == 0 and ep.stop_reason == "budget" and "wall_s" in ep.stop_detail
