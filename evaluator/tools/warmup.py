"""Every chosen problem's baselines timed (or found in the cache) ahead of a run: what `kloop
baseline` does, and the warm-up the experiment bench charges to first use, so both measure the
same thing.

Several problems at once overlap their CPU work (loading the reference, torch.compile's inductor
builds) while each timing still holds the device lock alone, as every evaluation's device stages
do, so the baselines are the same at any `concurrency`; only the wall time changes. A reference
that runs out of device memory beside another is timed again alone (`procs.devicegate`), as an
evaluation is.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from kloop.evaluator.common.config import EvalConfig
from kloop.problems.registry import Problem


@dataclass(frozen=True)
class Warmed:
    """One problem's warm-up: its reference's baselines, or why there are none."""

    problem_id: str
    reference: object | None  # harness.reference.ReferenceOutput (imported with torch)
    error: str | None
    seconds: float


def warm_up(jobs: Sequence[tuple[Problem, EvalConfig]], concurrency: int = 1,
            rebuild: bool = True, on_done: Callable[[Warmed], None] | None = None,
            catch: tuple[type[BaseException], ...] | None = None,
            keep: bool = False) -> tuple[list[Warmed], float]:
    """Baselines of every (problem, config), `concurrency` problems at once, in the given order
    in the returned list; `on_done` hears of each as it finishes. A reference that fails is a
    `Warmed` with its error (the problem's candidates will fail the same way); `catch` widens
    that to other exceptions (a bench keeps going, a command lets an infrastructure fault
    surface). Returns the list and the wall seconds of the whole warm-up.

    `keep` (a warm-up in the process that then judges the candidates, with `rebuild` off):
    each problem's kept baseline worker is started (`servers.warm`) where one may be kept, so
    first use is paid once: before, the warm-up timed the baselines and each problem's first
    candidate then started a worker that compiled them again under the lock (22.5-35.3 s each,
    the H200, 2026-12-06 at af624e7). Where none may be kept, the baselines are timed only."""
    if concurrency < 1:
        raise ValueError(f"concurrency must be at least 1, got {concurrency}")
    from kloop.evaluator.harness.reference import ReferenceFailure

    caught = (ReferenceFailure, *(catch or ()))

    def one(job: tuple[Problem, EvalConfig]) -> Warmed:
        prob, config = job
        t = time.monotonic()
        try:
            ref, err = _baselines(prob, config, rebuild, keep and not rebuild), None
        except caught as e:
            named = not isinstance(e, ReferenceFailure)  # the reference's own says what failed
            ref, err = None, f"{type(e).__name__}: {e}" if named else str(e)
        done = Warmed(prob.id, ref, err, time.monotonic() - t)
        if on_done is not None:
            on_done(done)
        return done

    t0 = time.monotonic()
    with ThreadPoolExecutor(min(concurrency, max(1, len(jobs)))) as pool:
        out = list(pool.map(one, jobs))
    return out, time.monotonic() - t0


def _baselines(prob: Problem, config: EvalConfig, rebuild: bool, keep: bool) -> object:
    """A kept worker's start (`keep`) or `build_baselines`, in this process's device gate; a
    reference that ran out of device memory beside another evaluation or a kept baseline worker
    runs again alone (timed, not kept), as an evaluation does (`pipeline.device_half`)."""
    from kloop.evaluator.harness.pipeline import alone, beside_others, build_baselines
    from kloop.evaluator.harness.reference import ReferenceFailure
    from kloop.evaluator.harness.servers import warm
    from kloop.evaluator.procs.devicegate import GATE, out_of_device_memory

    with GATE.shared() as hold:
        try:
            kept = warm(prob, config) if keep else None
            if kept is not None:
                return kept
            return build_baselines(prob, config, rebuild=rebuild)
        except ReferenceFailure as e:
            if not (beside_others(hold) and out_of_device_memory(str(e))):
                raise
    with alone():
        return build_baselines(prob, config, rebuild=rebuild)
