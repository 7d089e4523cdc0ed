"""GPU suite (run on the H200): the three baselines of the default config, eager, torch.compile
and torch.compile(mode="reduce-overhead"), measured, cached and compared with.

Run with `pytest tests/evaluator/test_gpu_baselines.py -m gpu -v` on the GPU machine.
"""

from __future__ import annotations

import pytest
from eval_helpers import MLP_SMALL, UNCOMPILABLE, candidate

from kloop.evaluator.common.config import EvalConfig
from kloop.evaluator.harness.pipeline import evaluate
from kloop.evaluator.harness.reference import BaselineRecord
from kloop.evaluator.procs.isolation import private_dir
from kloop.problems.registry import load_problem_set, reference_as_candidate

pytestmark = pytest.mark.gpu


def test_the_default_config_measures_three_baselines_and_names_the_fastest(tmp_path):
    cfg = EvalConfig(device="cuda", cache_dir=tmp_path / "cache", problem_overrides=MLP_SMALL)
    assert cfg.baselines == "auto"  # `all` on CUDA
    r = evaluate("L3/1", candidate("mlp_torch.py"), cfg)
    assert r.status == "correct", r.error
    assert not [f for f in r.flags if f.startswith("baseline_")], r.flags  # CUDA graphs ran
    named = {"eager": r.eager, "compile": r.compiled, "compile_ro": r.compiled_ro}
    for name, stats in named.items():
        assert stats is not None, name
        assert stats.clock == "harness" and stats.comparable and stats.measured_as == "reference"
        assert stats.n_trials == r.timing.n_trials and stats.median_ms > 0, (name, stats)
    assert r.speedup_clock == "harness"  # strict: every speedup on the trusted clock
    speedups = {"eager": r.speedup_vs_eager, "compile": r.speedup_vs_compile,
                "compile_ro": r.speedup_vs_compile_ro}
    for name, s in speedups.items():
        assert s == pytest.approx(named[name].median_ms / r.timing.median_ms), name
    assert r.speedup_vs_best == min(speedups.values())
    assert all(r.speedup_vs_best <= s for s in speedups.values())
    fastest = min(named, key=lambda n: named[n].median_ms)
    assert r.best_baseline == fastest, {n: t.median_ms for n, t in named.items()}

    # The result's baselines are timed in the candidate's paired rounds (`harness.paired`); the
    # cache keeps each compiled baseline's own session, which the next evaluation reads instead
    # of serving it again (one session each per problem), and keeps as it was.
    assert r.paired is not None and set(r.paired.baselines) == {"eager", "compile", "compile_ro"}
    (path,) = (private_dir(tmp_path / "cache") / "baselines").glob("*.json")
    record = BaselineRecord.model_validate_json(path.read_text())
    for stats in (record.compiled, record.compiled_ro):
        assert stats is not None and stats.clock == "harness" and stats.median_ms > 0, stats
        assert stats.n_trials == r.timing.n_trials
    again = evaluate("L3/1", candidate("mlp_torch.py"), cfg)
    assert again.status == "correct", again.error
    assert again.compiled is not None and again.compiled_ro is not None
    kept = BaselineRecord.model_validate_json(path.read_text())
    assert (kept.compiled, kept.compiled_ro) == (record.compiled, record.compiled_ro)
    print({n: round(t.median_ms, 4) for n, t in named.items()}, "candidate",
          round(r.timing.median_ms, 4), "best", r.best_baseline, r.speedup_vs_best,
          "ref_baselines s", r.stage_seconds.get("ref_baselines"),
          again.stage_seconds.get("ref_baselines"))


def test_compiled_baselines_that_fail_on_the_gpu_are_flagged(tmp_path):
    """torch.compile cannot trace the reference: both compiled roles are flagged on the one
    call channel and the candidate is judged against eager alone."""
    folder = tmp_path / "problems"
    folder.mkdir()
    (folder / "1_Uncompilable.py").write_text(UNCOMPILABLE)
    problem = load_problem_set(folder).problems[0]
    r = evaluate(problem, reference_as_candidate(UNCOMPILABLE),
                 EvalConfig(device="cuda", cache_dir=tmp_path / "cache"))
    assert r.status == "correct", r.error
    assert r.compiled is None and r.compiled_ro is None
    assert sorted(f.split(":")[0] for f in r.flags if f.startswith("baseline_")) == [
        "baseline_compile_failed", "baseline_compile_ro_failed"]
    assert (r.best_baseline, r.speedup_vs_best) == ("eager", r.speedup_vs_eager)
    assert r.speedup_vs_eager is not None
