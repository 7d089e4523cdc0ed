"""Build the concrete components a config names: problems, model, evaluator.

The run scripts (agent/run.py, agent/replay.py) call these; nothing deeper in the code imports
a concrete provider or the evaluator.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from datetime import datetime, timezone
from functools import lru_cache
from pathlib import Path
from typing import Any

from kloop.agent.config import ConfigError, RunConfig, judged_constants
from kloop.agent.errors import EvalInfraError
from kloop.agent.models import get_model
from kloop.agent.protocols import Evaluator, Model
from kloop.evaluator.common.config import EvalConfig
from kloop.evaluator.common.result import EvalResult
from kloop.evaluator.harness.precheck import check_overrides, small_overrides
from kloop.problems.registry import Problem, ProblemError, ProblemSet, load_problem_set

log = logging.getLogger(__name__)


@lru_cache(maxsize=4)
def _problem_set(problems_dir: Path | None) -> ProblemSet:
    # Hashing 50 problem files takes about a second; a process reads each set once.
    return load_problem_set(problems_dir)


def chosen_problems(pset: ProblemSet, cfg: RunConfig) -> list[Problem]:
    """The problems a config names, in the order given, then its level's in registry order."""
    chosen = [pset.get(p) for p in cfg.problems]
    if cfg.level is not None:
        chosen += [p for p in pset.filter(cfg.level) if p not in chosen]
    return chosen


def load_problems(cfg: RunConfig) -> list[Problem]:
    """The problems a config asks for (see `chosen_problems`), checked."""
    try:
        pset = _problem_set(cfg.problems_dir)
        chosen = chosen_problems(pset, cfg)
    except ProblemError as e:
        raise ConfigError(str(e)) from None
    if not chosen:
        raise ConfigError("no problems chosen: give --problem ID (repeatable) or --level N")
    for key, constants in cfg.problem_overrides.items():
        try:
            problem = pset.get(key)
        except ProblemError as e:
            raise ConfigError(f"problem_overrides: {e}") from None
        # A constant the problem does not define would fail only inside the reference worker.
        check_overrides(problem.source, constants, f"problem_overrides.{key}")
    return chosen


def with_size(cfg: RunConfig, size: str) -> RunConfig:
    """`--size small`: each chosen problem's small constants, under any given explicitly."""
    if size not in ("full", "small"):
        raise ConfigError(f"--size must be full or small, not {size!r}")
    if size == "full":
        return cfg
    given = {k.lower(): v for k, v in cfg.problem_overrides.items()}
    sizes = {p.id: {**small_overrides(p.source), **given.get(p.id.lower(), given.get(p.stem.lower(), {}))}
             for p in load_problems(cfg)}
    kept = {k: v for k, v in cfg.problem_overrides.items()
            if k.lower() not in {i.lower() for i in sizes}}
    return cfg.model_copy(update={"problem_overrides": {**kept, **sizes}})


def build_model(cfg: RunConfig) -> Model:
    try:
        return get_model(cfg.model.spec, cfg.model)
    except ValueError as e:
        raise ConfigError(str(e)) from None


def problem_configs(base: EvalConfig, overrides: dict[str, dict[str, Any]],
                    problems: list[Problem]) -> dict[str, EvalConfig]:
    """Each problem's EvalConfig: the run's, with that problem's constant overrides."""
    return {p.id: base.model_copy(update={"problem_overrides": judged_constants(
        base.problem_overrides, overrides, p.id, p.stem)}) for p in problems}


class LocalEvaluator:
    """kloop's own evaluator with the run's EvalConfig and per-problem constant overrides."""

    def __init__(self, base: EvalConfig, overrides: dict[str, dict[str, Any]],
                 problems: list[Problem]):
        self._evaluate = _import_evaluate()
        self.configs: dict[str, Any] = problem_configs(base, overrides, problems)
        self.base = base

    def warm_up(self, problems: list[Problem], concurrency: int) -> threading.Thread | None:
        """On a GPU, the kept baseline workers of the first `concurrency` problems (those the
        run starts with) started in the background while their first turns ask the model
        (`evaluator.tools.warmup`, `keep`): each times its baselines, or reads them from the
        cache `kloop baseline` filled, and compiles them once, instead of under its first
        candidate's lock hold. A problem's candidate that comes first waits for its worker's
        start. None on CPU (no kept workers there)."""
        from kloop.evaluator.procs.devicepool import pool
        from kloop.evaluator.tools.warmup import warm_up

        try:
            if self.base.kept_baselines == 0 or pool(self.base.device) == ["cpu"]:
                return None
        except RuntimeError:  # no such device: the evaluations say so, as without a warm-up
            return None
        jobs = [(p, self.configs.get(p.id, self.base)) for p in problems[:concurrency]]

        def run() -> None:
            warmed, wall = warm_up(jobs, concurrency, rebuild=False, keep=True,
                                   catch=(Exception,))
            failed = [w.problem_id for w in warmed if w.error is not None]
            log.info("kept baseline workers of %d problem(s) started in %.1f s%s", len(jobs),
                     wall, f"; failed: {', '.join(failed)}" if failed else "")

        t = threading.Thread(target=run, name="kloop-warm-up", daemon=True)
        t.start()
        return t

    def evaluate(self, problem: Problem, source: str) -> EvalResult:
        config = self.configs.get(problem.id, self.base)
        try:
            return self._evaluate(problem, source, config)
        except Exception as e:  # the evaluator reports candidate faults as results: this is ours
            raise _infra_error(problem, e) from e

    def head_to_head(self, problem: Problem, challenger: str, incumbent: str) -> EvalResult:
        """`challenger` judged again with `incumbent` timed beside it in the same paired rounds
        (`evaluator.harness.pipeline.head_to_head`): for a close call between two kernels."""
        from kloop.evaluator.harness.pipeline import head_to_head

        config = self.configs.get(problem.id, self.base)
        try:
            return head_to_head(problem, challenger, incumbent, config)
        except Exception as e:
            raise _infra_error(problem, e) from e

    @contextlib.contextmanager
    def batch(self, concurrency: int) -> Iterator[Submit]:
        """Many candidates through the evaluator's one queue (`evaluator.procs.scheduler`):
        `concurrency` in their device stages at once, static checks and builds of the next
        ones running ahead. `submit(problem, source)` -> a future of (result, seconds from the
        evaluation's start to its result: its queue for a build slot and the device included,
        its wait to be started not)."""
        from kloop.evaluator.procs.scheduler import Scheduler

        with Scheduler(concurrency) as sched:
            def submit(problem: Problem, source: str) -> Future[tuple[EvalResult, float]]:
                out: Future[tuple[EvalResult, float]] = Future()
                out.set_running_or_notify_cancel()

                def done(f: Future[EvalResult]) -> None:
                    try:
                        r = f.result()
                    except Exception as e:  # as `evaluate` says it: ours, not the candidate's
                        out.set_exception(_infra_error(problem, e))
                        return
                    began = datetime.fromisoformat(r.started_at)
                    out.set_result((r, (datetime.now(timezone.utc) - began).total_seconds()))

                config = self.configs.get(problem.id, self.base)
                sched.submit(problem, source, config).add_done_callback(done)
                return out

            yield submit


Submit = Callable[[Problem, str], "Future[tuple[EvalResult, float]]"]


def _infra_error(problem: Problem, e: Exception) -> EvalInfraError:
    return EvalInfraError(f"evaluator failed on {problem.id}: {type(e).__name__}: {e}")


def _import_evaluate():
    from kloop.evaluator import evaluate

    return evaluate


def build_evaluator(cfg: RunConfig, problems: list[Problem]) -> Evaluator:
    """The evaluator of `cfg.executor`: this process's, or a pool of workers on a Ray cluster
    (`agent.executor.ray_pool`) that run the same evaluator."""
    if cfg.executor.kind == "ray":
        from kloop.agent.executor.ray_pool import RayEvaluator

        return RayEvaluator(cfg, problems)
    return LocalEvaluator(cfg.eval, cfg.problem_overrides, problems)

