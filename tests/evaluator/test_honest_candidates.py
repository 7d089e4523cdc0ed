"""Honest candidates are judged correct on CPU (Triton under the interpreter, reduced sizes)."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest
from eval_helpers import (
    LENET_SMALL,
    MLP_SMALL,
    RELU_ATTENTION_SMALL,
    candidate,
    cpu_config,
)
from kloop.evaluator.harness.pipeline import evaluate

HONEST = [
    ("L3/1", "mlp_triton.py", MLP_SMALL),
    ("L3/4", "lenet_triton.py", LENET_SMALL),
    ("L3/50", "relu_attention_triton.py", RELU_ATTENTION_SMALL),
]


@pytest.fixture(scope="module")
def honest(cache_dir):
    # The default CPU path: interpreter for the numbers, sm_90 compilation for the kernels.
    # One config per problem (overrides differ), evaluated side by side.
    with ThreadPoolExecutor(max_workers=len(HONEST)) as pool:
        futures = {
            name: pool.submit(evaluate, problem, candidate(name),
                              cpu_config(cache_dir, problem_overrides=sizes, triton_aot=True))
            for problem, name, sizes in HONEST
        }
        return {name: f.result() for name, f in futures.items()}


@pytest.mark.parametrize("name", [h[1] for h in HONEST])
def test_honest_triton_candidate_is_correct(honest, name):
    r = honest[name]
    assert r.status == "correct", (r.error, [t.message for t in r.correctness])
    assert (r.stage_reached, r.backend, r.has_custom_kernel) == ("done", "triton", True)
    assert [t.kind for t in r.correctness] == ["random"] * 5 + ["reparam"]
    assert all(t.passed and t.outputs[0].max_abs_err < 1e-4 for t in r.correctness)
    assert "cpu_emulation" in r.flags
    assert r.compile is not None and r.compile.ok and r.compile.target == "sm_90"
    assert r.timing is not None and r.timing.clock == "harness" and not r.timing.comparable
    assert r.speedup_vs_eager is None  # host-clock numbers are never turned into speedups
    assert r.env is not None and r.env.gpu_arch is None


def test_both_baselines_are_served_by_one_reference_worker(tmp_path):
    """Eager and then torch.compile on one call channel: the first serve's stop must leave the
    channel open for the second (the GPU default; a closed channel failed every default-config
    evaluation on the H200 with `ReferenceFailure ... compile calls failed`)."""
    r = evaluate("L3/1", candidate("mlp_torch.py"),
                 cpu_config(tmp_path / "cache", baselines="both", cpu_timing_trials=2))
    assert r.status == "correct", r.error
    assert r.eager is not None and r.compiled is not None
    assert r.compiled.n_trials == 2 and r.compiled.median_ms > 0


def test_plain_pytorch_candidate_is_correct_without_custom_kernel(cache_dir):
    r = evaluate("L3/1", candidate("mlp_torch.py"), cpu_config(cache_dir, baselines="eager"))
    assert r.status == "correct", r.error
    assert (r.backend, r.has_custom_kernel) == ("torch", False)
    assert r.problem_overrides == MLP_SMALL
    assert r.eager is not None and r.eager.n_trials == 2 and r.eager.clock == "harness"
    assert "cpu_emulation" not in r.flags
    # Stage wall times are recorded per stage.
    assert {"static", "reference", "load", "correctness", "timing"} <= set(r.stage_seconds)
