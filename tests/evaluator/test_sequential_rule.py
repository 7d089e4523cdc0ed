"""The rounds' sequential rule (`Policy.timing_stop_width`): after the first half of the paired
rounds, stop once every speedup's interval is narrow; the precision check's secret calls are
drawn from both halves, so a stop leaves it whole and a late change of precision meets it.

On CPU with real worker processes: twenty timed calls a side in ten rounds, the check after
five."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from eval_helpers import candidate, cpu_config

from kloop.evaluator.common.config import POLICIES
from kloop.evaluator.harness.judge import PRECISION_CALLS, served64
from kloop.evaluator.harness.pipeline import evaluate

_MLP = candidate("mlp_torch.py")
_WRONG_LATE = _MLP.replace(
    "return F.linear(x, linears[-1].weight, linears[-1].bias)",
    "self._n = getattr(self, '_n', 0) + 1\n"
    "        y = F.linear(x, linears[-1].weight, linears[-1].bias)\n"
    "        return y * 1.5 if self._n > 17 else y")

pytestmark = pytest.mark.usefixtures("no_kept_workers")


@pytest.fixture
def rule(monkeypatch):
    """Two policies: `stop_wide`, whose width every interval meets (the rounds stop at the
    check), and `stop_never`, whose width none does."""
    made = {}
    for name, width in (("stop_wide", 1e9), ("stop_never", 1e-12)):
        p = POLICIES["strict"].model_copy(update={"name": name, "timing_stop_width": width})
        monkeypatch.setitem(POLICIES, name, p)
        made[name] = p
    return made


def _config(tmp_path, policy):
    return cpu_config(tmp_path / "cache", policy=policy, baselines="eager", cpu_timing_trials=20,
                      kept_baselines=0)


def test_narrow_intervals_stop_the_rounds_after_their_first_half(tmp_path, rule):
    r = evaluate("L3/1", _MLP, _config(tmp_path, "stop_wide"))
    assert r.status == "correct", (r.error, r.flags)
    assert r.paired.stopped_early and r.paired.rounds == 5 and r.paired.calls_per_round == 2
    assert r.timing.n_trials == r.eager.n_trials == 10
    assert r.paired.plan.calls == 20  # the plan's count; half of it was needed
    assert r.paired.width_at_check is not None and r.paired.width_at_check >= 0
    # The precision check's calls of the first half were all made and checked.
    assert r.precision is not None and r.precision_calls == PRECISION_CALLS


def test_wide_intervals_run_every_round(tmp_path, rule):
    r = evaluate("L3/1", _MLP, _config(tmp_path, "stop_never"))
    assert r.status == "correct", (r.error, r.flags)
    assert not r.paired.stopped_early and r.paired.rounds == 10
    assert r.paired.width_at_check > 1e-12  # what the check saw, wider than the width
    assert r.timing.n_trials == r.eager.n_trials == 20
    assert r.precision_calls == 2 * PRECISION_CALLS  # three in each half


def test_a_candidate_wrong_only_late_is_caught_where_the_rounds_go_on(tmp_path, rule):
    """It counts its own forward calls (seven probe trials and warm-up calls come first) and turns
    wrong from its 18th: timed call 10, the rounds' second half. Every call the rounds make is checked, so where they
    run on it is incorrect at a timed call; where they stop early its wrong calls never ran,
    and what was timed was correct work."""
    never = evaluate("L3/1", _WRONG_LATE, _config(tmp_path, "stop_never"))
    assert never.status == "incorrect" and never.stage_reached == "timing", never.status
    late = [t for t in never.correctness if t.kind == "timed"]
    assert len(late) == 1 and not late[0].passed and late[0].trial - 1000 >= 10  # second half
    wide = evaluate("L3/1", _WRONG_LATE, _config(tmp_path, "stop_wide"))
    assert wide.status == "correct", (wide.status, wide.error)
    assert wide.paired.stopped_early and wide.timing.n_trials == 10


def _run(policy: str, calls: int) -> SimpleNamespace:
    class Spec:
        trials = calls

    return SimpleNamespace(policy=POLICIES[policy], config=SimpleNamespace(precision="fp32"),
                           salt=b"s" * 32, root=__import__("pathlib").Path("/tmp/x"),
                           timing_spec=lambda: Spec)


@pytest.mark.parametrize("calls", [10, 20, 100])
def test_the_precision_calls_come_from_both_halves_under_the_rule(rule, calls):
    half = {10: 5, 20: 10, 100: 50}[calls]
    for salt in range(20):
        run = _run("stop_never", calls)
        run.salt = bytes([salt]) * 32
        picked = [s.index for s in served64(run)]
        assert len(picked) == 2 * PRECISION_CALLS and len(set(picked)) == len(picked)
        assert sum(i < half for i in picked) == PRECISION_CALLS, picked
    # Without the rule (or too few rounds for its check): three from anywhere.
    plain = _run("kernelbench", calls)
    assert plain.policy.timing_stop_width is None
    assert len(served64(_run("stop_never", 9))) == PRECISION_CALLS
