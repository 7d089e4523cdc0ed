"""`evaluate`: one candidate through the staged pipeline; `evaluate_many`: a batch of them.

static (parse, backend, static rules) -> compile (child, no GPU) -> reference (reference worker)
-> candidate (candidate child, judged here). Each stage takes the run's resources (`EvalRun`)
and the findings of the stages before it, and returns its own (`evaluator.harness.ledger`); the
list is kept here, in order, and the result is its fold: a `Decided` ends the run. Every number
in the result comes from a child process, every verdict from this process.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterator, Sequence

from kloop.evaluator.common.config import EvalConfig
from kloop.evaluator.common.result import EvalResult
from kloop.evaluator.harness.checks import result_checks
from kloop.evaluator.harness.judge import trial_kinds
from kloop.evaluator.harness.ledger import Ledger
from kloop.evaluator.harness.outcome import Finding, Flagged, verdict_of
from kloop.evaluator.harness.reference import ReferenceOutput
from kloop.evaluator.harness.servers import SERVERS
from kloop.evaluator.harness.stages import (
    candidate_stage,
    compile_stage,
    reference_job,
    reference_serving,
    reference_stage,
    static_stage,
)
from kloop.evaluator.harness.state import EvalRun, result_of
from kloop.evaluator.procs.devicegate import GATE, Hold, out_of_device_memory
from kloop.evaluator.procs.hostbytes import BUDGET, trial_bytes
from kloop.problems.registry import Problem, get_problem

log = logging.getLogger(__name__)

Stage = Callable[[EvalRun, Sequence[Finding]], list[Finding]]
"""A stage: the run's resources and the findings before it -> the findings it adds."""
FRONT_STAGES: tuple[Stage, ...] = (static_stage, compile_stage)
"""Stages that never touch the device: `evaluator.procs.scheduler` runs them ahead of it."""
DEVICE_STAGES: tuple[Stage, ...] = (reference_stage, candidate_stage)
STAGES = FRONT_STAGES + DEVICE_STAGES


def evaluate(problem: Problem | str, candidate_source: str,
             config: EvalConfig | None = None) -> EvalResult:
    """Evaluate one candidate source (a file defining `ModelNew`) against a reference problem.

    Candidate faults (compile errors, crashes, hangs, wrong outputs) come back as the result's
    status. Faults of the evaluator or the reference itself raise (`ReferenceFailure`, ...).
    """
    return _run_all(start(problem, candidate_source, config or EvalConfig()))


def _run_all(run: EvalRun) -> EvalResult:
    findings: list[Finding] = []
    try:
        run_stages(run, FRONT_STAGES, findings)
    except BaseException:
        run.cleanup()
        raise
    last, findings, error = device_half(run, findings)
    if error is not None:
        if last is not None:
            last.cleanup()
        raise error
    assert last is not None
    return finish(last, findings)


def device_half(run: EvalRun, findings: list[Finding],
                stages: tuple[Sequence[Stage], Sequence[Stage]] = (FRONT_STAGES, DEVICE_STAGES)
                ) -> tuple[EvalRun | None, list[Finding], BaseException | None]:
    """The device stages of a run whose front stages are over (`stages`: front, device), under
    this process's device gate. If it ran out of device memory while another evaluation was in
    its device stages, it is judged again from its start (a new run) holding the gate alone,
    and that run is the one returned, flagged `retried_alone`. Returns the run to finish, its
    findings and the evaluator fault that ended it, if one did."""
    error: BaseException | None = None
    if not decided(run, findings):
        with GATE.shared() as hold, BUDGET.reserve(outputs_reserved(run), run.root):
            try:
                run_stages(run, stages[1], findings)
            except BaseException as e:  # noqa: BLE001 (the caller raises or reports it)
                error = e
        if beside_others(hold) and _ran_out(run, findings, error):
            return _again_alone(run, stages)
    return run, findings, error


def outputs_reserved(run: EvalRun) -> int:
    """The disk an evaluation's probe-trial outputs take at full size (`procs.hostbytes`)."""
    if run.config.problem_overrides:
        return 0
    return trial_bytes(run.problem.meta.output_shape, len(trial_kinds(run)))


def beside_others(hold: Hold) -> bool:
    """Whether something else held device memory during `hold`: another evaluation in its
    device stages, or a kept baseline worker (`harness.servers`)."""
    return hold.crowded or SERVERS.alive() > 0


@contextlib.contextmanager
def alone() -> Iterator[None]:
    """This process's device stages to the caller alone: no other evaluation in them, and no
    idle kept baseline worker holding device memory."""
    with GATE.alone():
        SERVERS.close_idle()
        yield


def _ran_out(run: EvalRun, findings: list[Finding], error: BaseException | None) -> bool:
    """Out of device memory: an evaluator fault that says so (the reference ran out), or a
    candidate failure whose error does."""
    if error is not None:
        return isinstance(error, Exception) and out_of_device_memory(str(error))
    v = verdict_of(findings, run.root)
    return v.status == "runtime_error" and v.error is not None and out_of_device_memory(
        f"{v.error.type}: {v.error.message}")


def _again_alone(first: EvalRun, stages: tuple[Sequence[Stage], Sequence[Stage]]
                 ) -> tuple[EvalRun | None, list[Finding], BaseException | None]:
    """The evaluation again from its start, with no other in its device stages and no kept
    baseline worker. Out of memory alone is the candidate's verdict; one that only claims it
    has cost one more evaluation."""
    first.cleanup()
    run: EvalRun | None = None
    findings: list[Finding] = []
    with alone():
        try:
            run = start(first.problem, first.source, first.config)
            run.incumbent = first.incumbent
            run.retried_alone = True
            run_stages(run, stages[0], findings)
            run_stages(run, stages[1], findings)
        except BaseException as e:  # noqa: BLE001
            return run, findings, e
    findings.append(Flagged(flag="retried_alone: it ran out of device memory while another "
                                 "evaluation was in its device stages"))
    return run, findings, None


def head_to_head(problem: Problem | str, challenger: str, incumbent: str,
                 config: EvalConfig | None = None) -> EvalResult:
    """Evaluate `challenger` as `evaluate` does, with `incumbent` timed beside it in the same
    paired rounds (`evaluator.harness.headtohead`): the result's `head_to_head` says which is faster,
    with an interval. Charge its wall time (`stage_seconds`) as any evaluation's."""
    run = start(problem, challenger, config or EvalConfig())
    run.incumbent = incumbent
    return _run_all(run)


def start(problem: Problem | str, candidate_source: str, config: EvalConfig) -> EvalRun:
    if isinstance(problem, str):
        problem = get_problem(problem)
    run = EvalRun.create(problem, candidate_source, config)
    log.info("evaluating a candidate for %s on %s (policy %s, work dir %s)",
             problem.id, run.device, run.policy.name, run.root)
    return run


def run_stages(run: EvalRun, stages: Sequence[Stage], findings: list[Finding]) -> None:
    """Run `stages` in order, each given the findings so far, adding what it returns to
    `findings`; the first that decides a status ends the run. Each stage clocks its own wall
    time (less its wait for the device)."""
    for stage in stages:
        if decided(run, findings):
            return
        findings.extend(stage(run, tuple(findings)))


def decided(run: EvalRun, findings: Sequence[Finding]) -> bool:
    return verdict_of(list(findings), run.root).status is not None


def finish(run: EvalRun, findings: Sequence[Finding]) -> EvalResult:
    """The result of a run whose stages are over (its work dir removed first): the fold of its
    findings and of the result checks' (problem facts, speedup bounds, GPU conditions)."""
    run.cleanup()
    ledger = Ledger(run.root, tuple(findings))
    ledger.record(*(Flagged(flag=f"problem_{f}") for f in run.problem.meta.flags()))
    result_checks(run, ledger)
    return result_of(run, ledger.verdict)


def evaluate_many(problem_and_sources: Sequence[tuple[Problem | str, str]],
                  config: EvalConfig | None = None,
                  max_workers: int = 4, ahead: int | None = None) -> list[EvalResult]:
    """Evaluate many candidates, results in input order.

    `max_workers` evaluations at once in their device stages (the device lock still times one
    at a time); up to `ahead` more run their static checks and builds ahead of them
    (`evaluator.procs.scheduler`).
    """
    from kloop.evaluator.procs.scheduler import Scheduler

    with Scheduler(max_workers, ahead) as sched:
        futures = [sched.submit(p, s, config) for p, s in problem_and_sources]
    return [f.result() for f in futures]


def build_baselines(problem: Problem | str, config: EvalConfig | None = None,
                    rebuild: bool = True) -> ReferenceOutput:
    """Time (or, with `rebuild=False`, read from the cache) a problem's baselines only."""
    config = config or EvalConfig()
    if isinstance(problem, str):
        problem = get_problem(problem)
    run = EvalRun.create(problem, "", config)
    try:
        job = reference_job(run).model_copy(update={"trials": []})
        reference_stage(run, (), job, reference_serving(run, rebuild=rebuild))
    finally:
        run.cleanup()
    assert run.reference is not None
    return run.reference
