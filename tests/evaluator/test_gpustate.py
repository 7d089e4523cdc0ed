"""The GPU's clocks and temperature beside each timing (`evaluator.harness.gpustate`), and
baseline keys that do not depend on which GPU of the host or on fields added since."""

from __future__ import annotations

import pytest
from eval_helpers import MLP_SMALL, candidate, cpu_config

from kloop.evaluator.common.protocol import TimingSpec
from kloop.evaluator.harness import gpustate
from kloop.evaluator.harness.pipeline import evaluate
from kloop.evaluator.harness.reference import timing_key


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


def _timed(before: int | None, after: int | None, limits: list[str] | None = None):
    from kloop.evaluator.common.result import GpuSample, TimingStats

    def s(mhz):
        return None if mhz is None else GpuSample(sm_clock_mhz=mhz, clock_limits=limits)

    return TimingStats(median_ms=1.0, mean_ms=1.0, std_ms=0.0, min_ms=1.0, max_ms=1.0,
                       iqr_ms=0.0, n_trials=100, clock="harness", comparable=True,
                       gpu_before=s(before), gpu_after=s(after))


@pytest.mark.parametrize("cand, eager, flags", [
    (_timed(1980, 1980), _timed(1980, 1965), set()),
    (_timed(1980, 1980), _timed(1500, 1600), {"gpu_clock_differs"}),
    (_timed(1980, 1980, ["sw_thermal"]), _timed(1980, 1980), {"gpu_throttled"}),
    (_timed(1980, 1980, ["gpu_idle"]), None, set()),  # idle before the calls: not throttling
    (_timed(None, None), _timed(1980, 1980), set()),  # no NVML: nothing to say
])
def test_a_speedup_on_two_clocks_or_a_throttled_gpu_is_flagged(tmp_path, cand, eager, flags):
    from eval_helpers import cpu_config

    from kloop.evaluator.harness.checks import gpu_conditions
    from kloop.evaluator.harness.ledger import Ledger
    from kloop.evaluator.harness.outcome import Measured
    from kloop.evaluator.harness.state import EvalRun
    from kloop.problems.registry import get_problem

    run = EvalRun.create(get_problem("L3/1"), "", cpu_config(tmp_path / "cache"))
    try:
        ledger = Ledger(run.root)
        ledger.record(Measured(what="timing", stats=cand), Measured(what="eager", stats=eager))
        gpu_conditions(run, ledger)
        assert set(ledger.verdict.flags) & {"gpu_clock_differs", "gpu_throttled"} == flags
    finally:
        run.cleanup()


@pytest.mark.gpu
def test_the_devices_memory_as_nvml_counts_it():
    """What the kept workers' room is judged by (`servers.has_room`): free and total bytes of
    GPU 0, free never above total; None for a name NVML does not know."""
    from kloop.evaluator.harness.gpustate import memory

    got = memory("0")
    assert got is not None
    free, total = got
    assert 0 < free <= total and total > 8 << 30
    assert memory("cuda") is None
