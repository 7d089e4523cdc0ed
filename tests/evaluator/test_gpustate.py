"""The GPU's clocks and temperature beside each timing (`evaluator.harness.gpustate`), and
baseline keys that do not depend on which GPU of the host or on fields added since."""

from __future__ import annotations

import pytest
from eval_helpers import MLP_SMALL, candidate, cpu_config

from evaluator.harness import gpustate
from evaluator.pipeline import evaluate
from evaluator.protocol import TimingSpec
from evaluator.reference import timing_key


def test_a_baseline_key_names_how_calls_are_timed_not_which_gpu():
    plain = TimingSpec(trials=100, warmup_calls=3, warmup_ms=25.0)
    # What keys held before `gpu` and `l2_flusher` existed: cached baselines stay valid.
    assert timing_key(plain) == {"trials": 100, "warmup_calls": 3, "warmup_ms": 25.0,
                                 "l2_flush": True}
    assert timing_key(plain.model_copy(update={"gpu": "3"})) == timing_key(plain)
    flushed = plain.model_copy(update={"l2_flusher": "cuda:0"})
    assert timing_key(flushed) != timing_key(plain)


def test_no_reading_where_there_is_no_nvml():
    if gpustate._nvml() is not None:
        pytest.skip("this machine has NVML")
    assert gpustate.sample("0") is None


@pytest.mark.gpu
def test_each_timing_carries_the_gpu_state_around_its_calls(tmp_path):
    r = evaluate("L3/1", candidate("mlp_torch.py"), cpu_config(
        tmp_path / "cache", device="cuda", baselines="eager", problem_overrides=MLP_SMALL))
    assert r.status == "correct", r.error
    for stats in (r.timing, r.eager):
        assert stats is not None and stats.gpu_before is not None and stats.gpu_after is not None
        for s in (stats.gpu_before, stats.gpu_after):
            assert s.sm_clock_mhz and s.sm_clock_mhz > 100
            assert s.temperature_c is not None and 5 < s.temperature_c < 110
            assert s.clock_limits is not None
