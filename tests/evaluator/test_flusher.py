"""`l2_flush: trusted`: the L2 flush before each timed call is done by a process of the harness's
that runs no candidate code (`evaluator.harness.flusher`), not only by the serving process,
whose `prep` a candidate's native code could skip. On CPU the flusher writes a host buffer: the
protocol, restarts and failures are tested here; its effect on the L2 on the GPU."""

from __future__ import annotations

import os
import signal

import pytest
from eval_helpers import candidate, cpu_config
from kloop.evaluator.harness.flusher import Flusher, FlushFailed, flusher
from kloop.evaluator.harness.pipeline import evaluate


def test_every_served_call_is_preceded_by_a_trusted_flush(tmp_path):
    f = flusher("cpu")
    before = f.flushes
    cfg = cpu_config(tmp_path / "cache", baselines="eager", l2_flush="trusted",
                     cpu_timing_trials=3)
    r = evaluate("L3/1", candidate("mlp_torch.py"), cfg)
    assert r.status == "correct", r.error
    # Reference: warm-up, 3 null calls, 3 timed; candidate: warm-up and 3 timed, at least.
    assert f.flushes - before >= 3 + 3 + 3
    assert f.persisting_reset is False  # no CUDA runtime on CPU: said so, not pretended


def test_a_dead_flusher_is_started_again(tmp_path):
    f = flusher("cpu")
    f.flush()
    assert f._proc is not None
    os.kill(f._proc.pid, signal.SIGKILL)
    f._proc.wait()
    n = f.flushes
    f.flush()
    assert f.flushes == n + 1 and f._proc.poll() is None


def test_a_flusher_that_cannot_start_is_an_error_not_a_missing_flush():
    # A GPU flusher that sees no GPU (on any machine): its process exits before it is ready.
    broken = Flusher("cuda:0", {**os.environ, "CUDA_VISIBLE_DEVICES": ""})
    with pytest.raises(FlushFailed):
        broken.flush()
    assert broken.flushes == 0


@pytest.mark.gpu
def test_the_trusted_flusher_runs_on_the_gpu_and_resets_persisting_lines(tmp_path):
    from eval_helpers import MLP_SMALL

    cfg = cpu_config(tmp_path / "cache", device="cuda", l2_flush="trusted",
                     problem_overrides=MLP_SMALL)
    r = evaluate("L3/1", candidate("mlp_torch.py"), cfg)
    assert r.status == "correct" and r.timing is not None, r.error
    f = flusher(r.device)
    assert f.flushes > 0 and f.persisting_reset is True
