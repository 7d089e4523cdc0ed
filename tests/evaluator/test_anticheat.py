"""Runtime anti-cheat rules end to end on CPU: each cheat gets the strict verdict and rule that
catches it, the kernelbench policy only flags, honest candidates stay correct. One batch of
evaluations runs per module (two at a time); each test checks one result."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest
from eval_helpers import MLP_SMALL, candidate, cpu_config
from kloop.evaluator.harness.pipeline import evaluate

DEEP_NARROW = {"batch_size": 2, "input_size": 64, "hidden_layer_sizes": [32] * 16,
               "output_size": 128}
# (name, problem, sizes, policy, extra config)
CASES = [
    ("ghost_triton.py", "L3/1", MLP_SMALL, "strict", {}),
    ("ghost_triton.py", "L3/1", MLP_SMALL, "kernelbench", {}),
    ("unlaunched_triton.py", "L3/1", MLP_SMALL, "strict", {}),
    ("thread_finisher.py", "L3/1", MLP_SMALL, "strict", {}),
    ("clock_patch.py", "L3/1", MLP_SMALL, "strict", {}),
    ("clock_patch.py", "L3/1", MLP_SMALL, "kernelbench", {}),
    ("flag_alias.py", "L3/1", MLP_SMALL, "strict", {}),
    ("empty_output.py", "L3/1", MLP_SMALL, "strict", {}),
    ("noisy_output.py", "L3/1", MLP_SMALL, "strict", {}),
    # Enough timed calls on CPU for the cache to fill before the check inside the loop.
    ("phase_cache.py", "L3/1", MLP_SMALL, "strict", {"cpu_timing_trials": 6}),
    ("constant_deep_mlp.py", "L3/3", DEEP_NARROW, "strict", {}),
    ("constant_deep_mlp.py", "L3/3", DEEP_NARROW, "kernelbench", {}),
    ("deep_mlp_torch.py", "L3/3", DEEP_NARROW, "strict", {}),
    ("renamed_params_torch.py", "L3/1", MLP_SMALL, "strict", {}),
]


@pytest.fixture(scope="module")
def results(cache_dir):
    def run(case):
        name, problem, sizes, policy, extra = case
        config = cpu_config(cache_dir, problem_overrides=sizes, policy=policy, **extra)
        return evaluate(problem, candidate(name), config)

    with ThreadPoolExecutor(max_workers=2) as pool:
        out = list(pool.map(run, CASES))
    return {(c[0], c[3]): r for c, r in zip(CASES, out, strict=True)}


def _rules(r, severity="reject"):
    return {v.rule for v in r.violations if v.severity == severity}


def test_decorative_triton_kernel_is_a_ghost(results):
    r = results["ghost_triton.py", "strict"]
    assert (r.status, _rules(r)) == ("rejected", {"no_custom_kernel"})
    assert "ghost kernels" in r.violations[0].message
    kb = results["ghost_triton.py", "kernelbench"]
    assert kb.status == "correct" and "no_custom_kernel" in kb.flags
    assert _rules(kb) == set()


def test_kernel_that_never_launches_is_rejected(results):
    r = results["unlaunched_triton.py", "strict"]
    assert (r.status, _rules(r)) == ("rejected", {"no_custom_kernel"})
    assert "launched" in r.violations[0].message


def test_thread_still_running_after_forward_is_rejected(results):
    r = results["thread_finisher.py", "strict"]
    assert r.status == "rejected" and "background_threads" in _rules(r)


def test_replaced_clock_is_rejected_before_its_timings_count(results):
    r = results["clock_patch.py", "strict"]
    assert (r.status, _rules(r)) == ("rejected", {"timer_tampering"})
    assert "time.perf_counter" in r.violations[0].message
    assert r.timing is None
    kb = results["clock_patch.py", "kernelbench"]
    assert kb.status == "correct" and "timer_tampering" in kb.flags


def test_backend_flag_set_through_an_alias_is_rejected(results):
    r = results["flag_alias.py", "strict"]
    assert (r.status, _rules(r)) == ("rejected", {"backend_flags_changed"})
    assert "cudnn.benchmark: False -> True" in r.violations[0].message


def test_uninitialised_output_never_holds_the_reference_result(results):
    r = results["empty_output.py", "strict"]
    assert r.status == "incorrect"
    assert not any(t.passed for t in r.correctness)


def test_last_bit_noise_is_flagged_not_rejected(results):
    r = results["noisy_output.py", "strict"]
    assert r.status == "correct" and "nondeterministic" in r.flags
    assert [(v.rule, v.severity) for v in r.violations] == [("nondeterministic", "flag")]


def test_cache_that_starts_in_the_timing_loop_fails_a_timed_call(results):
    r = results["phase_cache.py", "strict"]
    assert r.status == "incorrect" and r.timing is None
    assert [t.kind for t in r.correctness if not t.passed] == ["timed"]


def test_constant_output_on_a_degenerate_problem_fails_its_probe_trial(results):
    r = results["constant_deep_mlp.py", "strict"]
    assert r.status == "incorrect"
    # Every input of every call is scaled into dependence: the first trials already fail.
    failed = {t.kind for t in r.correctness if not t.passed}
    assert "random" in failed
    assert {"degenerate_problem", "problem_degenerate@1e-4"} <= set(r.flags)
    kb = results["constant_deep_mlp.py", "kernelbench"]
    assert kb.status == "correct" and {"degenerate_problem", "degenerate_no_probe"} <= set(kb.flags)


def test_honest_candidates_pass_the_extra_trials(results):
    deep = results["deep_mlp_torch.py", "strict"]
    assert deep.status == "correct", [t.message for t in deep.correctness]
    assert [t.kind for t in deep.correctness] == ["random"] * 5 + ["reparam"]
    assert deep.timing is not None and deep.timing.clock == "harness"
    assert "degenerate_problem" in deep.flags and "degenerate_no_probe" not in deep.flags
    renamed = results["renamed_params_torch.py", "strict"]
    assert renamed.status == "correct", renamed.error
    # Renamed parameters take part in the reparam trial like any others.
    assert [t.kind for t in renamed.correctness] == ["random"] * 5 + ["reparam"]
    assert renamed.violations == []
