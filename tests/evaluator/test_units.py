"""Pure functions of the evaluator: output comparison, timing statistics, the child environment,
policies and seeds. No child processes here."""

from __future__ import annotations

import math
import time  # noqa: F401

import pytest
import torch

from kloop.evaluator.common.config import POLICIES, EvalConfig, UnknownPolicyError, get_policy
from kloop.evaluator.common.correctness import compare_outputs, compare_tensor
from kloop.evaluator.common.result import EvalResult
from kloop.evaluator.harness.served import (
    Served,
    bounded_events,
    event_bound_ms,
    overhead_ms,
    timing_stats,
)
from kloop.evaluator.harness.state import derive_seed, speedup, speedup_clock
from kloop.evaluator.procs.sandbox import child_env


def test_allclose_semantics_and_worst_elements():
    expected = torch.zeros(4, 8)
    got = expected.clone()
    got[1, 2] = 3e-4  # outside 1e-4 + 1e-4*0
    got[3, 7] = 5e-5  # inside
    got[0, 0] = 0.5
    d = compare_tensor(0, expected, got, "torch.Tensor", 1e-4)
    assert not d.ok and d.mismatch_fraction == pytest.approx(2 / 32)
    assert d.max_abs_err == pytest.approx(0.5)
    assert [w.index for w in d.worst] == [[0, 0], [1, 2]]
    assert d.worst[0].got == pytest.approx(0.5) and d.worst[0].expected == 0.0
    # The relative part of the bound scales with |expected|.
    big = torch.full((3,), 100.0)
    assert compare_tensor(0, big, big + 0.009, "torch.Tensor", 1e-4).ok
    assert not compare_tensor(0, big, big + 0.02, "torch.Tensor", 1e-4).ok


def test_nan_never_matches_and_inf_matches_only_itself():
    expected = torch.tensor([1.0, float("inf"), float("-inf"), float("nan")])
    d = compare_tensor(0, expected, expected.clone(), "torch.Tensor", 1e-2)
    assert not d.ok and d.mismatch_fraction == 0.25  # the NaN position
    assert (d.nan_expected, d.nan_got, d.inf_expected, d.inf_got) == (1, 1, 2, 2)
    flipped = torch.tensor([1.0, float("-inf"), float("-inf"), 0.0])
    d2 = compare_tensor(0, expected, flipped, "torch.Tensor", 1e-2)
    assert d2.mismatch_fraction == 0.5
    assert sorted(w.index for w in d2.worst) == [[1], [3]]


def _result_with(diff):
    from kloop.evaluator.common.result import CorrectnessTrial

    return EvalResult(evaluator_version="t", status="incorrect", stage_reached="correctness",
                      problem_id="p", problem_sha256="x", candidate_sha256="y", policy="strict",
                      device="cpu", started_at="now",
                      correctness=[CorrectnessTrial(trial=0, passed=False, outputs=[diff])])


def _max_errors_by_definition(e: torch.Tensor, g: torch.Tensor) -> tuple[float | None, ...]:
    """max |g - e| over the elements where it is finite (the same infinity on both sides counts
    0), and max |g - e| / |e| over those where e is also nonzero: element by element."""
    abs_errs, rel_errs = [], []
    for x, y in zip(e.tolist(), g.tolist(), strict=True):
        d = 0.0 if math.isinf(x) and x == y else abs(torch.tensor(y) - torch.tensor(x)).item()
        if math.isfinite(d):
            abs_errs.append(d)
            if abs(x) > 0:
                rel_errs.append((torch.tensor(d) / abs(torch.tensor(x))).item())
    return (max(abs_errs) if abs_errs else None, max(rel_errs) if rel_errs else None)


@pytest.mark.parametrize("case", ["mixed", "no_finite_diff", "all_zero_expected", "empty"])
def test_max_errors_are_the_maxima_over_the_elements_they_are_defined_on(case):
    inf, nan = float("inf"), float("nan")
    e, g = {
        "mixed": ([1.0, 0.0, -2.0, inf, -inf, nan, 3e38, 1e-40, 5.0, 0.0],
                  [1.5, 0.25, -2.0, inf, 4.0, 1.0, -3e38, 2e-40, nan, 0.0]),
        "no_finite_diff": ([inf, nan, 1.0], [-inf, 1.0, nan]),
        "all_zero_expected": ([0.0, 0.0, 0.0], [0.5, -1.0, 0.0]),
        "empty": ([], []),
    }[case]
    e, g = torch.tensor(e, dtype=torch.float32), torch.tensor(g, dtype=torch.float32)
    [d] = compare_outputs([e], [g], ["torch.Tensor"], 1e-4)
    assert (d.max_abs_err, d.max_rel_err) == _max_errors_by_definition(e, g)
    if case == "mixed":  # every branch of the definition is exercised
        assert d.max_abs_err is not None and d.max_rel_err is not None


def test_worst_element_values_round_trip_through_json_even_when_nan():
    expected = torch.tensor([1.0, 2.0])
    got = torch.tensor([float("nan"), 2.0])
    r = _result_with(compare_tensor(0, expected, got, "torch.Tensor", 1e-4))
    back = EvalResult.model_validate_json(r.model_dump_json())
    w = back.correctness[0].outputs[0].worst[0]
    assert w.index == [0] and math.isnan(w.got) and w.expected == 1.0


def test_type_shape_dtype_and_count_mismatches():
    e = torch.ones(2, 3)
    assert compare_tensor(0, e, None, "mod.Lazy", 1e-4).got_type == "mod.Lazy"
    assert compare_tensor(0, e, torch.ones(3, 2), "torch.Tensor", 1e-4).message.startswith("shape")
    assert "dtype" in compare_tensor(0, e, e.double(), "torch.Tensor", 1e-4).message
    [d] = compare_outputs([e, e], [e], ["torch.Tensor"], 1e-4)
    assert not d.ok and "returned 1 outputs, expected 2" in d.message


def test_timing_stats_are_net_of_the_handshake_and_keep_the_raw_numbers():
    served = Served(wall_ms=[4.5, 1.5, 3.5, 2.5, 100.5], event_ms=[1.0, None, 3.0, 2.0, 2.5])
    s = timing_stats(served, 0.5, on_cuda=True)
    assert (s.median_ms, s.min_ms, s.max_ms, s.n_trials) == (3.0, 1.0, 100.0, 5)
    assert s.mean_ms == pytest.approx(22.0) and s.iqr_ms == pytest.approx(2.0)
    assert (s.clock, s.raw_median_ms, s.handshake_ms) == ("harness", 3.5, 0.5)
    assert s.worker_event_median_ms == 2.25 and s.comparable
    # A handshake larger than a call never makes a time negative.
    assert timing_stats(Served(wall_ms=[0.1]), 0.5, on_cuda=False).median_ms == 0.0


def test_the_handshake_is_the_fastest_null_call_and_the_calibration_only_an_estimate():
    served = Served(wall_ms=[2.0, 2.2, 2.4], event_ms=[1.5, 1.6, 1.7], null_ms=[0.2, 0.3, 0.5])
    assert overhead_ms(served) == pytest.approx(0.6)
    # What is taken off is the fastest null call; the calibrated estimate rides along.
    assert served.handshake_ms() == pytest.approx(0.2)
    s = timing_stats(served, served.handshake_ms(), on_cuda=True,
                     null_call_ms=served.null_median_ms(), calibrated_overhead_ms=0.6)
    assert s.median_ms == pytest.approx(2.0) and s.calibrated_median_ms == pytest.approx(1.6)
    assert s.null_call_ms == pytest.approx(0.3)
    assert overhead_ms(Served(wall_ms=[2.0], event_ms=[None], null_ms=[0.2])) is None


def _reference_calls() -> Served:
    # Ten calls of ~2 ms whose serving overhead (wall minus events) is 0.10-0.19 ms.
    wall = [2.0 + 0.01 * i for i in range(10)]
    return Served(wall_ms=wall, event_ms=[w - 0.10 - 0.01 * i for i, w in enumerate(wall)],
                  null_ms=[0.05, 0.06])


def test_the_event_bound_is_the_reference_overhead_90th_percentile_never_below_the_handshake():
    ref = _reference_calls()
    assert event_bound_ms(ref, 0.05) == pytest.approx(0.181)
    assert event_bound_ms(ref, 0.5) == 0.5  # a handshake is served in any call
    assert event_bound_ms(Served(wall_ms=[2.0], event_ms=[None]), 0.05) is None


def test_bounded_events_are_the_events_where_the_trusted_clock_allows_them():
    ref = _reference_calls()
    bound = event_bound_ms(ref, 0.05)
    honest = bounded_events(ref, 0.05, bound)
    assert honest.median_ms == pytest.approx(float(torch.tensor(ref.event_ms).median()), abs=0.006)
    # The call with the slowest serving (0.19 ms, above the 90th percentile) is moved up.
    assert (honest.raised, honest.lowered) == (1, 0)
    assert honest.mean_ms == pytest.approx(sum(ref.event_ms) / 10 + (0.19 - bound) / 10)
    # Events forged to an eighth: every call is moved up to its wall time less the bound, so
    # the forgery gains at most `bound - handshake` per call.
    forged = Served(wall_ms=ref.wall_ms, event_ms=[w / 8 for w in ref.wall_ms])
    f = bounded_events(forged, 0.05, bound)
    assert f.raised == 10 and f.min_ms == pytest.approx(2.0 - bound)
    # Events longer than the call less its fastest serving are cut to that.
    slow = Served(wall_ms=ref.wall_ms, event_ms=[w * 3 for w in ref.wall_ms])
    s = bounded_events(slow, 0.05, bound)
    assert s.lowered == 10 and s.max_ms == pytest.approx(2.09 - 0.05)
    # A worker that withholds one call's events gets the trusted clock's numbers only.
    gap = Served(wall_ms=ref.wall_ms, event_ms=[*ref.event_ms[:9], None])
    assert bounded_events(gap, 0.05, bound) is None
    assert timing_stats(gap, 0.05, on_cuda=True, event_bound=bound).events is None
    assert timing_stats(ref, 0.05, on_cuda=False, event_bound=bound).events is None
    assert timing_stats(ref, 0.05, on_cuda=True, event_bound=bound).events == honest


def test_kernelbench_divides_bounded_events_and_strict_the_trusted_clock():
    ref = _reference_calls()
    bound = event_bound_ms(ref, 0.05)
    eager = timing_stats(ref, 0.05, on_cuda=True, event_bound=bound)
    twice = Served(wall_ms=[w / 2 + 0.1 for w in ref.wall_ms],
                   event_ms=[e / 2 for e in ref.event_ms])
    cand = timing_stats(twice, 0.05, on_cuda=True, event_bound=bound)
    kb, strict = get_policy("kernelbench"), get_policy("strict")
    assert speedup_clock(strict, cand, eager) == "harness"
    assert speedup_clock(kb, cand, eager) == "events_bounded"
    assert speedup(cand, eager, "mean", "events_bounded") == pytest.approx(
        eager.events.mean_ms / cand.events.mean_ms)
    assert speedup(cand, eager, "mean", "events_bounded") != pytest.approx(
        speedup(cand, eager, "mean", "harness"))
    # A baseline without events (cached before they were kept) is divided on the clock.
    old = eager.model_copy(update={"events": None})
    assert speedup_clock(kb, cand, old) == "harness"
    assert speedup(cand, old, "mean", "events_bounded") == pytest.approx(
        old.mean_ms / cand.mean_ms)


def test_child_env_is_an_allow_list(monkeypatch, tmp_path):
    monkeypatch.setenv("OPENAI_API_KEY", "sk-x")
    monkeypatch.setenv("TRITON_API_TOKEN", "t")
    monkeypatch.setenv("TRITON_CACHE_DIR", "/somewhere")
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    monkeypatch.setenv("SOME_RANDOM_SETTING", "1")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "4,5")
    env = child_env(tmp_path, "cuda:1", {"TRITON_INTERPRET": "0"})
    assert "OPENAI_API_KEY" not in env and "TRITON_API_TOKEN" not in env
    assert "SOME_RANDOM_SETTING" not in env
    assert env["TRITON_CACHE_DIR"] == "/somewhere"
    assert env["TRITON_INTERPRET"] == "0"  # only what we set, never inherited
    assert env["CUDA_VISIBLE_DEVICES"] == "5"
    assert env["HOME"] == str(tmp_path)
    assert child_env(tmp_path, "cpu")["CUDA_VISIBLE_DEVICES"] == ""


def test_policies_are_named_and_unknown_names_list_the_known_ones():
    assert set(POLICIES) == {"strict", "kernelbench"}
    strict, kb = get_policy("strict"), get_policy("kernelbench")
    assert strict.allow_tf32 is False and kb.allow_tf32 is None
    assert (kb.tolerance("fp32"), kb.tolerance("bf16"), kb.correct_trials) == (1e-4, 1e-2, 5)
    assert (kb.speedup_stat, kb.timing_trials) == ("mean", 100)
    with pytest.raises(UnknownPolicyError, match="known policies: kernelbench, strict"):
        get_policy("fast")
    with pytest.raises(ValueError, match="unknown policy"):
        EvalConfig(policy="fast")
    assert EvalConfig().policy == "strict"
    with pytest.raises(ValueError):
        EvalConfig(device="gpu")


def test_seeds_depend_on_the_salt_and_the_trial():
    a = [derive_seed("salt-a", "input", k) for k in range(5)]
    assert len(set(a)) == 5
    assert a != [derive_seed("salt-b", "input", k) for k in range(5)]
    assert derive_seed("salt-a", "input", 0) != derive_seed("salt-a", "forward", 0)
    assert all(0 <= s < 2**63 for s in a)


def test_a_cached_compile_baseline_survives_a_fresh_eager_measurement(tmp_path):
    from kloop.evaluator.common.protocol import TimingSpec
    from kloop.evaluator.common.result import EnvInfo, TimingStats
    from kloop.evaluator.harness.reference import (
        BaselineRecord,
        ReferenceOutput,
        Serving,
        cache_record,
        store_record,
    )

    def stats(ms: float) -> TimingStats:
        return TimingStats(median_ms=ms, mean_ms=ms, std_ms=0.0, min_ms=ms, max_ms=ms,
                           iqr_ms=0.0, n_trials=1, clock="harness", comparable=True)

    serving = Serving(seeds=[1], timing=TimingSpec(trials=1, warmup_calls=0, warmup_ms=0.0),
                      on_cuda=True, budget_s=1.0, null_calls=0, cache_dir=tmp_path,
                      key_extra={"policy": "strict"})
    env = EnvInfo(python="3", torch="t", device_name="gpu", hostname="h")
    out = ReferenceOutput(env=env, eager=stats(2.0), compiled=stats(1.0))
    record, path = cache_record(serving, out)
    store_record(path, record, out, serving)
    # A later evaluation measures eager afresh before it reaches the compile role.
    later = ReferenceOutput(env=env, eager=stats(2.5))
    record, path = cache_record(serving, later)
    assert isinstance(record, BaselineRecord) and record.compiled == stats(1.0)
    store_record(path, record, later, serving)
    again, _ = cache_record(serving, later)
    assert again is not None and again.compiled == stats(1.0) and again.eager == stats(2.5)
