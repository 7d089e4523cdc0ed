"""Isolation: a crash does not leak into the next candidate, the memory watchdog, policies."""

from __future__ import annotations

from eval_helpers import candidate, cpu_config

from evaluator.pipeline import evaluate


def test_next_candidate_after_a_crash_runs_fine(cache_dir):
    config = cpu_config(cache_dir)
    crashed = evaluate("L3/1", candidate("segfault.py"), config)
    after = evaluate("L3/1", candidate("mlp_torch.py"), config)
    assert crashed.status == "runtime_error" and crashed.error.type == "SIGSEGV"
    assert after.status == "correct", after.error


def test_host_memory_watchdog_kills_a_growing_process(cache_dir):
    # No address-space limit here, so only the harness's RSS watchdog can stop it.
    config = cpu_config(cache_dir, cpu_memory_limit_gb=1024.0, host_rss_limit_gb=1.5)
    r = evaluate("L3/1", candidate("memory_hog.py"), config)
    assert r.status == "runtime_error"
    assert r.error.type == "MemoryLimit"
    assert r.stage_reached == "correctness"


def test_kernelbench_policy_only_flags_input_mutation(cache_dir):
    r = evaluate("L3/1", candidate("mutates_input.py"), cpu_config(cache_dir, policy="kernelbench"))
    assert (r.status, r.policy) == ("correct", "kernelbench")
    assert [(v.rule, v.severity) for v in r.violations] == [("input_mutation", "flag")]
    assert "input_mutation" in r.flags
    # KernelBench checks no output after timing.
    assert [t.kind for t in r.correctness] == ["random"] * 5
