"""What the stages of an evaluation find, as typed records, and the one place they are folded.

Stages, the judge of the candidate's messages and the checks never write a verdict: each finding
is a record below. A stage adds its own to a `Ledger` (`evaluator.harness.ledger`) and returns
them; the pipeline keeps the ordered list (`evaluator.harness.pipeline.run_stages`), and the run
(`EvalRun`) holds resources only. The `Verdict` (status, stage, trials, measurements, flags...)
is the fold of the list by the rules of `fold`, made afresh on every read (`Ledger.verdict`),
and `EvalResult` is built from it (`evaluator.harness.state.result_of`). The rules:

- the first `Decided` stands: a verdict decided on a wrong timed output is not undone by the
  crash or the error report of the process killed after it; it keeps the stage it was decided
  in;
- before that, `Reached` (a stage a child reported) never moves the stage back (the sm_90 check
  of a Triton candidate's kernels runs after its correctness trials, which it does not undo);
  `Entered` (a stage the harness starts) sets it;
- a violation of a runtime rule also raises its flag (the rule table, `evaluator.common.rules`, says
  which rules are runtime ones);
- `Noted` amends the message of a trial already judged (the worker's account of a failed call
  arrives after the harness judged it).
"""

from __future__ import annotations

import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict

from kloop.evaluator.common.result import (
    Backend,
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
from kloop.evaluator.harness.errortext import FLAG_CHARS, NAME_CHARS, cut, for_model, scrub

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


class Detected(_Finding):
    """What the static stage read from the source: its backend."""

    backend: Backend
    has_custom_kernel: bool


class Clocked(_Finding):
    """Seconds the harness spent on a stage of its own (added up per name)."""

    name: str
    seconds: float


Finding = (Decided | Entered | Reached | Flagged | Violated | Judged | Noted | Failed | Measured
           | Built | Profiled | Observed | Precision | Paired | Compared | Detected | Clocked)


@dataclass
class Verdict:
    """The fold of a run's findings: everything `EvalResult` reports about the candidate."""

    status: Status | None = None
    stage: Stage = "static"
    backend: Backend | None = None
    has_custom_kernel: bool | None = None
    compile: CompileLog | None = None
    trials: list[CorrectnessTrial] = field(default_factory=list)
    timing: TimingStats | None = None
    eager: TimingStats | None = None
    compiled: TimingStats | None = None
    compiled_ro: TimingStats | None = None
    profile: ProfileSummary | None = None
    violations: list[Violation] = field(default_factory=list)
    flags: list[str] = field(default_factory=list)
    error: ErrorInfo | None = None
    stage_seconds: dict[str, float] = field(default_factory=dict)
    env: EnvInfo | None = None
    precision: PrecisionCheck | None = None
    paired: PairedSummary | None = None
    speedup_ci: dict[str, SpeedupInterval] = field(default_factory=dict)
    head_to_head: HeadToHead | None = None
    precision_calls: int = 0
    """Timed calls whose output was checked against float64 (`harness.timed`)."""


def verdict_of(findings: list[Finding], root: Path) -> Verdict:
    """The verdict the findings make, in order (`root`: the evaluation's dir, kept out of the
    error text the model sees)."""
    v = Verdict()
    for f in findings:
        fold(v, f, root)
    return v


def violated(*violations: Violation) -> list[Violated]:
    return [Violated(violation=v) for v in violations]


def fold(v: Verdict, f: Finding, root: Path) -> None:
    """Apply one finding to a verdict (the only writer of its fields)."""
    if isinstance(f, Decided):
        if v.status is None:
            v.status, v.stage = f.status, f.stage
            if f.error is not None:
                v.error = for_model(f.error, root)
    elif isinstance(f, Entered):
        if v.status is None:  # a decided verdict keeps the stage it was decided in
            v.stage = f.stage
    elif isinstance(f, Reached):
        if v.status is None and _STAGE_ORDER.index(f.stage) > _STAGE_ORDER.index(v.stage):
            v.stage = f.stage
    elif isinstance(f, Flagged):
        v.flags.append(cut(f.flag, root, FLAG_CHARS))
    elif isinstance(f, Violated):
        v.violations.append(f.violation.model_copy(
            update={"message": cut(f.violation.message, root)}))
        if RULES[f.violation.rule].kind == "runtime":
            v.flags.append(f.violation.rule)
    elif isinstance(f, Judged):
        msg = f.trial.message
        v.trials.append(f.trial if msg is None else f.trial.model_copy(
            update={"message": cut(msg, root)}))
    elif isinstance(f, Noted):
        for i, t in enumerate(v.trials):
            if t.trial == f.trial:
                v.trials[i] = t.model_copy(update={"message": cut(f.message, root)})
    elif isinstance(f, Failed):
        v.error = for_model(f.error, root)
    elif isinstance(f, Measured):
        setattr(v, f.what, f.stats)
    elif isinstance(f, Built):
        v.compile = _cut_log(f.log, root)
    elif isinstance(f, Profiled):
        v.profile = f.summary.model_copy(update={"kernels": [
            k.model_copy(update={"name": cut(k.name, root, NAME_CHARS)})
            for k in f.summary.kernels], "text": cut(f.summary.text, root, 8000)})
    elif isinstance(f, Observed):
        v.env = f.env
    elif isinstance(f, Precision):
        v.precision_calls += f.timed_call
        # The first check stands unless a later one fails: the result shows a failure.
        if v.precision is None or (v.precision.ok and not f.check.ok):
            v.precision = f.check
    elif isinstance(f, Compared):
        v.head_to_head = f.head_to_head
    elif isinstance(f, Paired):
        v.paired, v.speedup_ci = f.summary, dict(f.intervals)
    elif isinstance(f, Detected):
        v.backend, v.has_custom_kernel = f.backend, f.has_custom_kernel
    elif isinstance(f, Clocked):
        v.stage_seconds[f.name] = round(v.stage_seconds.get(f.name, 0.0) + f.seconds, 3)
    else:  # pragma: no cover - a new kind of finding without a rule
        raise TypeError(f"no rule folds a {type(f).__name__}")


def _cut_log(log: CompileLog, root: Path) -> CompileLog:
    """A compile log with its diagnostics and tail scrubbed of host paths (`errortext.cut`);
    `log_path` (the full log, in the harness's cache) stays for the user."""
    return log.model_copy(update={
        "diagnostics": [d.model_copy(update={"message": cut(d.message, root)})
                        for d in log.diagnostics],
        "log_tail": scrub(log.log_tail, root),  # already cut to LOG_TAIL_BYTES
        "infra_error": cut(log.infra_error, root) if log.infra_error else log.infra_error})
