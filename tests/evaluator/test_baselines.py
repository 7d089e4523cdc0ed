"""The three baselines (eager, torch.compile, torch.compile reduce-overhead): the speedup
against the fastest, their cache records old and new, and compiled baselines that fail."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from eval_helpers import UNCOMPILABLE, candidate, cpu_config

from kloop.evaluator.common.protocol import TimingSpec
from kloop.evaluator.common.result import BoundedEvents, EnvInfo, EvalResult, TimingStats
from kloop.evaluator.harness.baselines import BestBaseline, best_of
from kloop.evaluator.harness.ledger import Ledger
from kloop.evaluator.harness.outcome import Decided, Measured
from kloop.evaluator.harness.pipeline import evaluate
from kloop.evaluator.harness.reference import (
    BaselineRecord,
    ReferenceOutput,
    Serving,
    cache_record,
    store_record,
)
from kloop.evaluator.harness.state import EvalRun, result_of
from kloop.evaluator.procs.isolation import private_dir
from kloop.problems.registry import get_problem, load_problem_set, reference_as_candidate


def stats(ms: float, events_ms: float | None = None) -> TimingStats:
    events = None if events_ms is None else BoundedEvents(
        median_ms=events_ms, mean_ms=events_ms, std_ms=0.0, min_ms=events_ms, max_ms=events_ms,
        bound_ms=0.1, raised=0, lowered=0)
    return TimingStats(median_ms=ms, mean_ms=ms, std_ms=0.0, min_ms=ms, max_ms=ms, iqr_ms=0.0,
                       n_trials=3, clock="harness", comparable=True, events=events)


def test_the_best_baseline_is_the_one_beaten_by_the_least():
    assert best_of({"eager": 2.0, "compile": 1.5, "compile_ro": 1.2}) == BestBaseline("compile_ro", 1.2)
    assert best_of({"eager": 0.9, "compile": 1.5, "compile_ro": 1.2}) == BestBaseline("eager", 0.9)
    # Missing baselines are left out, whichever they are.
    assert best_of({"eager": 2.0, "compile": None, "compile_ro": 1.2}) == ("compile_ro", 1.2)
    assert best_of({"eager": 2.0, "compile": 1.5}) == ("compile", 1.5)
    assert best_of({"eager": None, "compile": None, "compile_ro": None}) == (None, None)
    assert best_of({}) == (None, None)
    # Ties go to the simpler baseline: eager, then compile, then compile_ro.
    assert best_of({"eager": 1.5, "compile": 1.5, "compile_ro": 1.5}) == ("eager", 1.5)
    assert best_of({"eager": 2.0, "compile": 1.5, "compile_ro": 1.5}) == ("compile", 1.5)


@pytest.fixture
def run(tmp_path):
    r = EvalRun.create(get_problem("L3/1"), "", cpu_config(tmp_path / "cache"))
    yield r
    r.cleanup()


def _result(run: EvalRun, status: str = "correct", **baselines: TimingStats | None) -> EvalResult:
    ledger = Ledger(run.root)
    ledger.record(Decided(status=status, stage="done"), Measured(what="timing", stats=stats(1.0)),
                  *(Measured(what=w, stats=s) for w, s in baselines.items()))
    return result_of(run, ledger.verdict)


def test_a_result_carries_every_speedup_and_names_the_fastest_baseline(run):
    r = _result(run, eager=stats(3.0), compiled=stats(2.0), compiled_ro=stats(1.25))
    assert (r.speedup_vs_eager, r.speedup_vs_compile, r.speedup_vs_compile_ro) == (3.0, 2.0, 1.25)
    assert (r.best_baseline, r.speedup_vs_best) == ("compile_ro", 1.25)
    assert r.compiled_ro == stats(1.25)
    again = EvalResult.model_validate_json(r.model_dump_json())
    assert (again.best_baseline, again.speedup_vs_best) == ("compile_ro", 1.25)


def test_a_failed_reduce_overhead_baseline_leaves_the_best_of_the_others(run):
    r = _result(run, eager=stats(3.0), compiled=stats(2.0), compiled_ro=None)
    assert r.compiled_ro is None and r.speedup_vs_compile_ro is None
    assert (r.best_baseline, r.speedup_vs_best) == ("compile", 2.0)


def test_an_incorrect_candidate_has_no_speedup_against_any_baseline(run):
    r = _result(run, status="incorrect", eager=stats(3.0), compiled=stats(2.0),
                compiled_ro=stats(1.0))
    assert r.compiled_ro == stats(1.0)  # measured all the same
    assert (r.speedup_vs_compile_ro, r.speedup_vs_best, r.best_baseline) == (None, None, None)


def test_the_best_is_the_smallest_speedup_on_each_pairs_own_clock(tmp_path):
    """Under kernelbench a baseline with bounded events is divided on them, one cached without
    them on the trusted clock (`state.speedup`); the best is read from those speedups."""
    r = EvalRun.create(get_problem("L3/1"), "", cpu_config(tmp_path / "cache", policy="kernelbench"))
    try:
        ledger = Ledger(r.root)
        ledger.record(Decided(status="correct", stage="done"),
                      Measured(what="timing", stats=stats(1.0, events_ms=0.5)),
                      Measured(what="eager", stats=stats(3.0, events_ms=2.0)),
                      Measured(what="compiled", stats=stats(1.6)),  # no events: 1.6 / 1.0
                      Measured(what="compiled_ro", stats=stats(1.1, events_ms=0.9)))  # 0.9 / 0.5
        res = result_of(r, ledger.verdict)
    finally:
        r.cleanup()
    assert res.speedup_clock == "events_bounded"
    assert (res.speedup_vs_eager, res.speedup_vs_compile) == (4.0, 1.6)
    assert res.speedup_vs_compile_ro == pytest.approx(1.8)
    assert (res.best_baseline, res.speedup_vs_best) == ("compile", 1.6)


def test_a_result_written_before_the_third_baseline_still_reads():
    old = EvalResult(evaluator_version="0.2", status="correct", stage_reached="done",
                     problem_id="L3/1", problem_sha256="p", candidate_sha256="c", policy="strict",
                     device="cuda:0", started_at="t", eager=stats(2.0), speedup_vs_eager=2.0)
    data = json.loads(old.model_dump_json())
    for key in ("compiled_ro", "speedup_vs_compile_ro", "speedup_vs_best", "best_baseline"):
        del data[key]
    r = EvalResult.model_validate(data)
    assert (r.compiled_ro, r.speedup_vs_best, r.best_baseline) == (None, None, None)


# -- the cache record -------------------------------------------------------------------------

ENV = EnvInfo(python="3", torch="t", device_name="gpu", hostname="h")


def _serving(cache: Path) -> Serving:
    return Serving(seeds=[1], timing=TimingSpec(trials=1, warmup_calls=0, warmup_ms=0.0),
                   on_cuda=True, budget_s=1.0, null_calls=0, cache_dir=cache,
                   key_extra={"policy": "strict"})


def test_a_record_from_before_reduce_overhead_loads_and_gains_it_when_measured(tmp_path):
    serving = _serving(tmp_path)
    _, path = cache_record(serving, ReferenceOutput(env=ENV))
    assert path is not None
    # A schema-2 record as it was written: no compiled_ro, no flags.
    old = {"schema_version": 2, "key": path.stem, "key_fields": {"policy": "strict"},
           "eager": stats(2.0).model_dump(), "compiled": stats(1.5).model_dump(),
           "env": ENV.model_dump(), "updated_at": "2026-11-30T00:00:00+00:00"}
    path.write_text(json.dumps(old))
    record, _ = cache_record(serving, ReferenceOutput(env=ENV))
    assert record is not None and record.compiled == stats(1.5) and record.compiled_ro is None
    assert record.settled("compile") and not record.settled("compile_ro")
    # An evaluation that asks for it: eager afresh, compile read, compile_ro served.
    later = ReferenceOutput(env=ENV, eager=stats(2.5), compiled=record.compiled,
                            compiled_ro=stats(1.0),
                            served_roles={"compile_ro": ["baseline_compile_ro_no_cudagraphs: 1"]})
    store_record(path, record, later, serving)
    new = BaselineRecord.model_validate_json(path.read_text())
    assert (new.eager, new.compiled, new.compiled_ro) == (stats(2.5), stats(1.5), stats(1.0))
    assert new.flags == {"compile_ro": ["baseline_compile_ro_no_cudagraphs: 1"]}
    assert new.schema_version == 3 and new.settled("compile_ro")


def test_a_failed_compiled_baseline_is_kept_as_settled_until_served_again(tmp_path):
    serving = _serving(tmp_path)
    record, path = cache_record(serving, ReferenceOutput(env=ENV))
    failed = ["baseline_compile_ro_failed: RuntimeError: capture failed"]
    store_record(path, record, ReferenceOutput(env=ENV, eager=stats(2.0), compiled=stats(1.5),
                                         served_roles={"compile": [], "compile_ro": failed}),
           serving)
    record, _ = cache_record(serving, ReferenceOutput(env=ENV))
    assert record is not None and record.compiled_ro is None
    assert record.settled("compile_ro") and record.flags == {"compile_ro": failed}
    # Another evaluation measures eager again: the failure and the compile baseline stay.
    store_record(path, record, ReferenceOutput(env=ENV, eager=stats(2.2), compiled=stats(1.5)), serving)
    record, _ = cache_record(serving, ReferenceOutput(env=ENV))
    assert record is not None and record.flags == {"compile_ro": failed}
    assert record.compiled == stats(1.5) and record.eager == stats(2.2)
    # Served again (a rebuild) and measured: the failure is gone.
    store_record(path, record, ReferenceOutput(env=ENV, eager=stats(2.2), compiled_ro=stats(1.1),
                                         served_roles={"compile_ro": []}), serving)
    record, _ = cache_record(serving, ReferenceOutput(env=ENV))
    assert record is not None and record.compiled_ro == stats(1.1) and record.flags == {}


# -- through the reference worker, on CPU -----------------------------------------------------

def _records(cache: Path) -> list[BaselineRecord]:
    return [BaselineRecord.model_validate_json(p.read_text())
            for p in (private_dir(cache) / "baselines").glob("*.json")]


def test_compiled_baselines_that_fail_are_flagged_and_the_evaluation_goes_on(tmp_path):
    """torch.compile raises on the reference's first call: each compiled role is flagged, the
    next one is still served on the same channel (it was a `ReferenceFailure` before), and
    the failures are cached: the next evaluation serves neither and raises the same flags."""
    folder = tmp_path / "problems"
    folder.mkdir()
    (folder / "1_Uncompilable.py").write_text(UNCOMPILABLE)
    problem = load_problem_set(folder).problems[0]
    cfg = cpu_config(tmp_path / "cache", baselines="all", problem_overrides={})
    first = evaluate(problem, reference_as_candidate(UNCOMPILABLE), cfg)
    assert first.status == "correct", first.error
    assert first.eager is not None and first.compiled is None and first.compiled_ro is None
    failures = sorted(f for f in first.flags if "_failed" in f)
    assert [f.split(":")[0] for f in failures] == ["baseline_compile_failed",
                                                   "baseline_compile_ro_failed"]
    assert all("TorchRuntimeError" in f and "\n" not in f for f in failures)
    (path,) = (private_dir(tmp_path / "cache") / "baselines").glob("*.json")
    record = BaselineRecord.model_validate_json(path.read_text())
    assert record.settled("compile") and record.settled("compile_ro")
    assert sorted(f for fs in record.flags.values() for f in fs) == failures
    # Marked, so that a flag read from the record tells itself from one served again.
    marked = {role: [f"{f}, as cached" for f in fs] for role, fs in record.flags.items()}
    path.write_text(record.model_copy(update={"flags": marked}).model_dump_json())
    second = evaluate(problem, reference_as_candidate(UNCOMPILABLE), cfg)
    assert second.status == "correct", second.error
    assert sorted(f for f in second.flags if "_failed" in f) == [f"{f}, as cached" for f in failures]
    again = BaselineRecord.model_validate_json(path.read_text())
    assert again.flags == marked and again.updated_at != record.updated_at  # eager afresh


def test_reduce_overhead_on_cpu_is_measured_when_asked_and_flagged_without_cuda_graphs(tmp_path):
    cfg = cpu_config(tmp_path / "cache", baselines="all")
    r = evaluate("L3/1", candidate("mlp_torch.py"), cfg)
    assert r.status == "correct", r.error
    assert r.eager is not None and r.compiled is not None and r.compiled_ro is not None
    assert r.compiled_ro.measured_as == "reference" and r.compiled_ro.n_trials == 2
    assert [f for f in r.flags if f.startswith("baseline_")] == [
        "baseline_compile_ro_no_cudagraphs: 1 graph(s) ran without CUDA graphs (inductor "
        "skipped them)"]
    # Host-clock numbers: no speedup against any baseline, so no best either.
    assert (r.speedup_vs_compile_ro, r.speedup_vs_best, r.best_baseline) == (None, None, None)
    (record,) = _records(tmp_path / "cache")
    assert record.compiled_ro is not None and list(record.flags) == ["compile_ro"]
    # By default a CPU evaluation times eager only.
    plain = evaluate("L3/1", candidate("mlp_torch.py"), cpu_config(tmp_path / "cache",
                                                                   baselines="auto"))
    assert plain.eager is not None and plain.compiled is None and plain.compiled_ro is None
    assert not [f for f in plain.flags if f.startswith("baseline_")]
