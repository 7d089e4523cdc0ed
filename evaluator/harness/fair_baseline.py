"""The eager baseline measured the way candidates are (`eager_baseline_from: candidate`).

On the H200 the same code timed 3-4 % slower in a candidate process than in the reference
worker with its own CUDA events, and 2x at 0.1 ms (bench/clock.py, 2026-12-01 at 771c910 and 9be831f): the
reference worker only serves calls, while a candidate process runs the trials first and is
judged between its timed calls. Whatever the cause, a speedup whose two sides are measured by
different procedures carries it. With this option the eager baseline is the reference's own
code submitted as a candidate (`Model` renamed `ModelNew`) and judged by the whole candidate path, so
the speedup of identical code is 1 up to noise by construction.

Harness side, between the reference and candidate stages (no device lock held: the nested
evaluation takes it for its own stages). Cached next to the reference worker's baselines, under
the same key plus `measured_as: candidate`, so it costs one evaluation per problem, sizes,
policy, hardware and software; threads of one harness that need the same one wait for the
first.
"""

from __future__ import annotations

import re
import threading
from datetime import datetime, timezone
from pathlib import Path

from kloop.evaluator.common.result import TimingStats
from kloop.evaluator.harness.outcome import Measured
from kloop.evaluator.harness.reference import (
    BaselineRecord,
    ReferenceFailure,
    atomic_write,
    baseline_key,
    key_fields,
)
from kloop.evaluator.harness.state import EvalRun
from kloop.evaluator.procs.isolation import private_dir

_locks: dict[str, threading.Lock] = {}
_locks_guard = threading.Lock()


def honest_source(problem_source: str) -> str:
    """The reference module as a candidate: its own code, with `Model` named `ModelNew`
    everywhere (the class, `super(Model, self)`), as an honest plain-PyTorch candidate is."""
    return re.sub(r"(?<![\w.])Model\b", "ModelNew", problem_source)


def eager_as_candidate_stage(run: EvalRun) -> None:
    """Replace the reference worker's eager baseline with one measured as a candidate."""
    from kloop.evaluator.harness.stages import baseline_kinds, reference_serving

    if run.config.eager_baseline_from != "candidate" or "eager" not in baseline_kinds(run):
        return
    assert run.reference is not None and run.reference.env is not None
    serving = reference_serving(run)
    fields = {**key_fields(serving, run.reference.env), "measured_as": "candidate"}
    key = baseline_key(fields)
    path = private_dir(run.config.cache_dir) / "baselines" / f"{key}.json"
    with run.timed("eager_as_candidate"), _lock(key):
        stats = _cached(path) or _measure(run, path, key, fields)
    run.record(Measured(what="eager", stats=stats.model_copy(update={"measured_as": "candidate"})))


def _lock(key: str) -> threading.Lock:
    with _locks_guard:
        return _locks.setdefault(key, threading.Lock())


def _cached(path: Path) -> TimingStats | None:
    try:
        return BaselineRecord.model_validate_json(path.read_text()).eager
    except (OSError, ValueError):
        return None


def _measure(run: EvalRun, path: Path, key: str, fields: dict) -> TimingStats:
    from kloop.evaluator.harness.pipeline import evaluate

    # The nested run needs no baselines of its own (and must not ask for this one again), and
    # runs on this evaluation's GPU (not whichever of the pool is least busy).
    cfg = run.config.model_copy(update={"baselines": "none", "eager_baseline_from": "reference",
                                        "profile": False, "device": run.device})
    r = evaluate(run.problem, honest_source(run.problem.path.read_text()), cfg)
    if r.status != "correct" or r.timing is None or r.env is None:
        why = r.error.message if r.error is not None else ", ".join(r.flags) or "no timing"
        raise ReferenceFailure(f"the reference's own code, judged as a candidate for the eager "
                               f"baseline, was {r.status}: {why}")
    record = BaselineRecord(key=key, key_fields=fields, env=r.env, eager=r.timing,
                            updated_at=datetime.now(timezone.utc).isoformat())
    atomic_write(path, record.model_dump_json(indent=1))
    return r.timing
