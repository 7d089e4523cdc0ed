"""The paired rounds' device-time budget (`evaluator.harness.budget`): how many timed calls
each side gets, decided before the reference stage from an eager median the trusted reference
measured at the full count, never from the candidate.

On CPU with real worker processes (a policy with a budget every call exceeds, and a config that
raises the CPU's count to 20), and on a GPU at full size.
"""

from __future__ import annotations

import pytest
from eval_helpers import candidate, cpu_config

from kloop.evaluator.common.config import POLICIES
from kloop.evaluator.harness import budget
from kloop.evaluator.harness.pipeline import evaluate

_MLP = candidate("mlp_torch.py")
_WRONG = _MLP.replace("return F.linear(x, linears[-1].weight, linears[-1].bias)",
                      "return F.linear(x, linears[-1].weight, linears[-1].bias) * 1.5")

pytestmark = pytest.mark.usefixtures("no_kept_workers")


def test_the_ladder_and_the_count_it_gives():
    strict = POLICIES["strict"]
    assert budget.ladder(100, 20) == [100, 50, 30, 20]
    assert budget.ladder(5, 20) == [5]  # the CPU's count: nothing to cut
    assert budget.ladder(20, 4) == [20, 10, 6, 4]
    # 250 ms a side: 100 calls up to 2.5 ms a call, then 50, 30, and never fewer than 20.
    got = {ms: budget.calls_for(100, strict, ms) for ms in (0.1, 2.5, 2.6, 5.0, 5.1, 8.3, 8.4,
                                                            84.6)}
    assert got == {0.1: 100, 2.5: 100, 2.6: 50, 5.0: 50, 5.1: 30, 8.3: 30, 8.4: 20, 84.6: 20}
    assert budget.calls_for(100, strict, None) == 100  # nothing measured yet
    assert budget.calls_for(100, POLICIES["kernelbench"], 84.6) == 100  # KernelBench's 100


def _timed_calls(r) -> int:
    assert r.paired is not None and r.timing is not None, (r.status, r.error, r.flags)
    assert r.paired.rounds * r.paired.calls_per_round == r.timing.n_trials == r.eager.n_trials
    return r.timing.n_trials


def test_the_first_evaluation_measures_at_the_full_count_and_sets_the_next_ones(tmp_path, tight_budget):
    config = cpu_config(tmp_path / "cache", policy=tight_budget.name, baselines="eager",
                        cpu_timing_trials=20, kept_baselines=0)
    first = evaluate("L3/1", _MLP, config)
    assert first.status == "correct", (first.error, first.flags)
    assert _timed_calls(first) == 20
    assert first.paired.plan.model_dump() == {
        "calls": 20, "full": 20, "budget_ms": 1e-6, "eager_ms": None, "source": "unmeasured"}

    second = evaluate("L3/1", _MLP, config)
    assert second.status == "correct", (second.error, second.flags)
    assert _timed_calls(second) == 4
    plan = second.paired.plan
    assert (plan.calls, plan.full, plan.source) == (4, 20, "earlier_evaluation")
    # The estimate is the first evaluation's reference worker's own eager calls (trusted, at
    # the full count, before the rounds; their wall median, the handshake in), and it stands.
    assert plan.eager_ms is not None and plan.eager_ms >= first.paired.unpaired_eager_ms
    assert evaluate("L3/1", _MLP, config).paired.plan == plan
    # `kloop eval` says how many calls and why.
    from rich.console import Console

    from kloop.evaluator.tools.cli import render

    console = Console(record=True, width=200)
    render(second, console)
    text = console.export_text()
    assert "4 timed calls a side in 4 paired rounds (the budget's count: 1e-06 ms a side" in text
    assert "from the earlier evaluation; 20 without it)" in text

    # Fewer calls, every one still checked: a wrong candidate is wrong.
    wrong = evaluate("L3/1", _WRONG, config)
    assert wrong.status == "incorrect", (wrong.status, wrong.flags)

    # Another problem's sizes are another estimate: its first evaluation is at the full count.
    other = config.model_copy(update={"problem_overrides": {**config.problem_overrides,
                                                            "batch_size": 3}})
    assert evaluate("L3/1", _MLP, other).paired.plan.source == "unmeasured"


def test_a_kept_worker_start_is_the_estimate_and_a_policy_without_budget_keeps_its_count(
        tmp_path, tight_budget):
    config = cpu_config(tmp_path / "cache", policy=tight_budget.name, baselines="eager",
                        cpu_timing_trials=20, kept_baselines=1)
    r = evaluate("L3/1", _MLP, config)
    assert r.status == "correct", (r.error, r.flags)
    assert _timed_calls(r) == 4 and r.paired.plan.source == "kept_worker"

    strict = evaluate("L3/1", _MLP, config.model_copy(update={"policy": "strict"}))
    assert strict.status == "correct" and _timed_calls(strict) == 20
    assert strict.paired.plan.calls == strict.paired.plan.full == 20


@pytest.mark.gpu
def test_on_a_gpu_a_slow_full_size_problem_gets_fewer_calls_with_an_interval(tmp_path):
    """L3/11 (VGG16 at full size: about 11 ms a call on the H100) under the default policy: the
    kept worker's start sets 20 calls a side; the reference as its own candidate is correct with
    a speedup near 1 whose interval holds it; KernelBench's policy keeps 100."""
    from kloop.evaluator.common.config import EvalConfig
    from kloop.problems.registry import get_problem, reference_as_candidate

    budget.forget_all()
    config = EvalConfig(device="cuda", cache_dir=tmp_path / "cache", baselines="eager")
    src = reference_as_candidate(get_problem("L3/11").path.read_text())
    r = evaluate("L3/11", src, config)
    assert r.status == "correct", (r.status, r.error, r.flags)
    plan = r.paired.plan
    assert plan.source == "kept_worker" and plan.eager_ms is not None and plan.eager_ms > 8.4
    # Twenty calls a side, or ten where the sequential rule stopped after the first half (it
    # looked once: ten rounds; its reading is kept either way).
    assert _timed_calls(r) == (10 if r.paired.stopped_early else 20) and plan.calls == 20
    w = r.paired.width_at_check
    assert w is not None and (w <= 0.02) == r.paired.stopped_early, r.paired
    ci = r.speedup_ci["eager"]
    assert ci.low <= 1.0 <= ci.high or 0.97 < r.speedup_vs_eager < 1.03, (r.speedup_vs_eager, ci)
    kb = evaluate("L3/11", src, config.model_copy(update={"policy": "kernelbench"}))
    assert kb.status == "correct" and _timed_calls(kb) == 100 and kb.paired.plan.calls == 100
    print("budget", plan, r.stage_seconds, "kernelbench", kb.stage_seconds)
