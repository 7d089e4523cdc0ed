"""What the stages of an evaluation find, as typed records, and the one place they are folded.

Stages, the judge of the candidate's messages and the checks do not write the run's verdict
fields: each finding is a record below, handed to `EvalRun.record`, which folds it by the rules
of `fold` and keeps the ordered list (`EvalRun.findings`). The rules that used to be scattered
as guards beside each assignment live here:

- the first `Decided` stands: a verdict decided on a wrong timed output is not undone by the
  crash or the error report of the process killed after it; it keeps the stage it was decided
  in;
- before that, `Reached` (a stage a child reported) never moves the stage back (the sm_90 check
  of a Triton candidate's kernels runs after its correctness trials, which it does not undo);
  `Entered` (a stage the harness starts) sets it;
- a violation of a runtime rule also raises its flag (the rule table, `evaluator.rules`, says
  which rules are runtime ones);
- `Noted` amends the message of a trial already judged (the worker's account of a failed call
  arrives after the harness judged it).
"""

from __future__ import annotations

import typing
from typing import TYPE_CHECKING, Literal

from kloop.evaluator.common.result import (
    BaselineName,
    CompileLog,
    CorrectnessTrial,
    EnvInfo,
    ErrorInfo,
    HeadToHead,
    PairedSummary,
    PrecisionCheck,
    ProfileSummary,
    SpeedupInterval,
    Stage,
    Status,
    TimingStats,
    Violation,
)
from kloop.evaluator.common.rules import RULES
from kloop.evaluator.harness.errortext import for_model
from pydantic import BaseModel, ConfigDict

if TYPE_CHECKING:
    from kloop.evaluator.harness.state import EvalRun

_STAGE_ORDER: tuple[Stage, ...] = typing.get_args(Stage)


class _Finding(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Decided(_Finding):
    """The verdict, with the stage it was decided in (and the error, if one says why)."""

    status: Status
    stage: Stage
    error: ErrorInfo | None = None


class Entered(_Finding):
    stage: Stage


class Reached(_Finding):
    stage: Stage


class Flagged(_Finding):
    flag: str


class Violated(_Finding):
    violation: Violation


class Judged(_Finding):
    trial: CorrectnessTrial


class Noted(_Finding):
    trial: int
    message: str


class Failed(_Finding):
    """An error known before (or without) a verdict of its own."""

    error: ErrorInfo


class Measured(_Finding):
    what: Literal["timing", "eager", "compiled", "compiled_ro"]
    stats: TimingStats | None


class Built(_Finding):
    log: CompileLog


class Profiled(_Finding):
    summary: ProfileSummary


class Observed(_Finding):
    env: EnvInfo | None


class Precision(_Finding):
    check: PrecisionCheck
    timed_call: bool = False
    """From a timed call (counted in `precision_calls`), not the first probe trial."""


class Compared(_Finding):
    head_to_head: HeadToHead


class Paired(_Finding):
    summary: PairedSummary
    intervals: dict[BaselineName, SpeedupInterval]


Finding = (Decided | Entered | Reached | Flagged | Violated | Judged | Noted | Failed | Measured
           | Built | Profiled | Observed | Precision | Paired | Compared)


def violated(*violations: Violation) -> list[Violated]:
    return [Violated(violation=v) for v in violations]


def fold(run: EvalRun, f: Finding) -> None:
    """Apply one finding to the run (the only writer of the verdict's fields)."""
    if isinstance(f, Decided):
        if run.status is None:
            run.status, run.stage = f.status, f.stage
            if f.error is not None:
                run.error = for_model(f.error, run.root)
    elif isinstance(f, Entered):
        if run.status is None:  # a decided verdict keeps the stage it was decided in
            run.stage = f.stage
    elif isinstance(f, Reached):
        if run.status is None and _STAGE_ORDER.index(f.stage) > _STAGE_ORDER.index(run.stage):
            run.stage = f.stage
    elif isinstance(f, Flagged):
        run.flags.append(f.flag)
    elif isinstance(f, Violated):
        run.violations.append(f.violation)
        if RULES[f.violation.rule].kind == "runtime":
            run.flags.append(f.violation.rule)
    elif isinstance(f, Judged):
        run.trials.append(f.trial)
    elif isinstance(f, Noted):
        for i, t in enumerate(run.trials):
            if t.trial == f.trial:
                run.trials[i] = t.model_copy(update={"message": f.message})
    elif isinstance(f, Failed):
        run.error = for_model(f.error, run.root)
    elif isinstance(f, Measured):
        setattr(run, f.what, f.stats)
    elif isinstance(f, Built):
        run.compile = f.log
    elif isinstance(f, Profiled):
        run.profile = f.summary
    elif isinstance(f, Observed):
        run.env = f.env
    elif isinstance(f, Precision):
        run.precision_calls += f.timed_call
        # The first check stands unless a later one fails: the result shows a failure.
        if run.precision is None or (run.precision.ok and not f.check.ok):
            run.precision = f.check
    elif isinstance(f, Compared):
        run.head_to_head = f.head_to_head
    elif isinstance(f, Paired):
        run.paired, run.speedup_ci = f.summary, dict(f.intervals)
    else:  # pragma: no cover - a new kind of finding without a rule
        raise TypeError(f"no rule folds a {type(f).__name__}")
