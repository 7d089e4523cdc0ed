"""A large output through whole CPU evaluations: past the clock's whole-snapshot size it is
copied after the clock into the channel's kept buffer (`evaluator.harness.output`), and with the
reference's outputs kept at secret positions (forced here: on a GPU it takes 512 MB over the
timed calls) every timed call is checked there. An honest candidate stays correct, and one
that starts serving cached outputs once timing begins fails a timed call."""

from __future__ import annotations

import pytest
from eval_helpers import candidate, cpu_config

from evaluator.fair_baseline import honest_source
from evaluator.harness import expected as expected_mod
from evaluator.harness.clock import FULL_SNAPSHOT_BYTES
from evaluator.pipeline import evaluate
from problems.registry import get_problem

WIDE = {"batch_size": 64, "input_size": 32, "layer_sizes": [32], "output_size": 2048}
"""L3/1 with a 512 KiB output: past the whole snapshot, and past `SAMPLES` elements."""


@pytest.mark.slow
def test_a_large_output_is_checked_at_secret_positions_on_every_timed_call(cache_dir,
                                                                         monkeypatch):
    assert WIDE["batch_size"] * WIDE["output_size"] * 4 > FULL_SNAPSHOT_BYTES
    assert WIDE["batch_size"] * WIDE["output_size"] > expected_mod.SAMPLES
    monkeypatch.setattr(expected_mod, "FULL_BUDGET_BYTES", 0)
    config = cpu_config(cache_dir, problem_overrides=WIDE, cpu_timing_trials=6)

    honest = evaluate("L3/1", honest_source(get_problem("L3/1").path.read_text()), config)
    assert honest.status == "correct" and honest.timing is not None, honest.error

    cached = evaluate("L3/1", candidate("phase_cache.py"), config)
    assert cached.status == "incorrect" and cached.timing is None
    [timed] = [t for t in cached.correctness if not t.passed]
    assert timed.kind == "timed"
    assert "checked at 16384 secret positions" in (timed.message or "") + " ".join(
        d.message or "" for d in timed.outputs)
