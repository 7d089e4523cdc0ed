"""What one episode is and carries: its spec, its collaborators, and its state between turns.

The loop (agent/loop.py) drives these; everything here is plain bookkeeping that can be rebuilt
from the turns on disk, which is how resume continues an interrupted episode.
"""

from __future__ import annotations

import hashlib
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, NamedTuple, Protocol

from kloop.agent.budget import Meter, Spend
from kloop.agent.config import AgentConfig, Limits, judged_constants
from kloop.agent.errors import InfraFault
from kloop.agent.models.base import Address, Message, ModelReply, ToolSpec
from kloop.agent.prompts import PromptSet
from kloop.agent.protocols import Evaluator, Model
from kloop.agent.records import (
    BestDecision,
    BestKernel,
    CallRecord,
    EpisodeRecord,
    ModelFaultInfo,
    StopReason,
    TurnRecord,
    TurnRef,
    utcnow,
)
from kloop.agent.report.bound import Bound, bound_of
from kloop.agent.tally import Measure, decide, replaces, speedup_interval
from kloop.evaluator.common.config import Comparison
from kloop.evaluator.common.result import ErrorInfo, EvalResult
from kloop.problems.cost import cost_of
from kloop.problems.registry import Problem


class TurnSink(Protocol):
    """Where finished turns go (the run store): durably, before the next turn starts."""

    def kernel_relpath(self, problem_stem: str, episode: int, turn: int) -> str: ...

    def append_turn(self, record: TurnRecord) -> None: ...

    def append_call(self, record: CallRecord) -> None: ...


@dataclass
class EpisodeSpec:
    """Which episode to run: the problem, its key and place in the strategy, and its context."""

    problem: Problem
    key: str
    episode: int
    """Index of the episode within its problem (kernel files are `<episode>-<turn>.py`)."""
    sample: int
    max_turns: int
    round: int = 0
    parent: TurnRef | None = None
    prefix: list[TurnRecord] = field(default_factory=list)
    """The parent's trajectory up to `parent.turn`: context for the model, not this episode's turns."""


@dataclass
class EpisodeEnv:
    """The collaborators of every episode of a run."""

    run_id: str
    model: Model
    evaluator: Evaluator
    agent: AgentConfig
    limits: Limits
    run_meter: Meter
    sink: TurnSink
    prompts: PromptSet
    comparison: Comparison
    """How the evaluator compares outputs (precision, tolerance): the task prompt states it."""
    base_overrides: dict[str, Any] = field(default_factory=dict)
    """The evaluator's own constant overrides (`eval.problem_overrides`), for every problem."""
    problem_overrides: dict[str, dict[str, Any]] = field(default_factory=dict)
    """The run's per-problem constant overrides (`problem_overrides`, `--size small`)."""
    on_turn: Callable[[TurnRecord], None] | None = None


def episode_key(problem_sha256: str, config_digest: str, lineage: str) -> str:
    """sha256 of what makes an episode itself: its problem, the run's config, its place."""
    return hashlib.sha256(f"{problem_sha256}\n{config_digest}\n{lineage}".encode()).hexdigest()


def sha256_text(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


class HistoryRow(NamedTuple):
    turn: int
    status: str
    runtime_ms: float | None
    speedup_vs_eager: float | None
    speedup_vs_compile: float | None


def history_row(position: int, result: EvalResult | None) -> HistoryRow:
    if result is None:
        return HistoryRow(position, "format_error", None, None, None)
    return HistoryRow(position, result.status, result.runtime_ms, result.speedup_vs_eager,
                      result.speedup_vs_compile)


def best_of(rec: TurnRecord) -> BestKernel:
    ev = rec.eval
    assert ev is not None and rec.kernel_path is not None and rec.code_sha256 is not None
    return BestKernel(
        turn=rec.turn,
        kernel_path=rec.kernel_path,
        code_sha256=rec.code_sha256,
        runtime_ms=ev.runtime_ms,
        speedup_vs_eager=ev.speedup_vs_eager,
        speedup_vs_compile=ev.speedup_vs_compile,
        speedup_vs_best=ev.speedup_vs_best,
        best_baseline=ev.best_baseline,
        speedup_interval=speedup_interval(ev),
        comparable=bool(ev.timing and ev.timing.comparable),
    )


class EpisodeState:
    """The turns so far (inherited prefix, then this episode's own) and what follows from them."""

    def __init__(self, spec: EpisodeSpec, own: list[TurnRecord] | None = None):
        self.spec = spec
        self.own: list[TurnRecord] = []
        self.best: BestKernel | None = None
        self._best_turn: TurnRecord | None = None
        self.consecutive_faults = 0
        self.spend = Spend()
        for rec in own or []:
            self.add(rec)

    def add(self, rec: TurnRecord) -> None:
        self.own.append(rec)
        self.spend = self.spend + rec.spend
        self.consecutive_faults = self.consecutive_faults + 1 if rec.fault else 0
        if rec.eval is None or not rec.eval.correct or rec.code is None:
            return
        if self._best_turn is None or replaces(self._best_turn, rec):
            self._best_turn, self.best = rec, best_of(rec)

    def decide(self, rec: TurnRecord, measure: Measure | None = None) -> BestDecision | None:
        """Whether `rec` (a turn not yet added) replaces the episode's best kernel, as its turn
        record keeps it (`TurnRecord.best_decision`); `measure`: a head-to-head for a close
        call (`agent.tally.settle_close_call`)."""
        return decide(self._best_turn, rec, measure)

    @property
    def trajectory(self) -> list[TurnRecord]:
        return self.spec.prefix + self.own

    @property
    def parent(self) -> TurnRef | None:
        """The node the next turn continues: this episode's last turn, else where it branched from."""
        if self.own:
            return TurnRef(episode_key=self.spec.key, turn=self.own[-1].turn)
        return self.spec.parent

    @property
    def position(self) -> int:
        """Trajectory position of the next turn (1-based, inherited turns included)."""
        return len(self.spec.prefix) + len(self.own) + 1

    def history(self) -> list[HistoryRow]:
        return [history_row(i, rec.eval) for i, rec in enumerate(self.trajectory, start=1)]


def opening(spec: EpisodeSpec, env: EpisodeEnv) -> list[Message]:
    """The system and task messages every turn of the episode starts with."""
    total = len(spec.prefix) + spec.max_turns
    sizes = judged_constants(env.base_overrides, env.problem_overrides, spec.problem.id,
                             spec.problem.stem)
    variables = {"problem": spec.problem, "backend": env.agent.backend, "gpu": env.agent.gpu,
                 "max_turns": total, "comparison": env.comparison, "sizes": sizes}
    return [
        Message(role="system", content=env.prompts.render("system", **variables)),
        Message(role="user", content=env.prompts.render("task", **variables)),
    ]


def ask(model: Model, messages: list[Message], at: Address,
        tools: list[ToolSpec] | None = None) -> ModelReply:
    """One query (offered `tools`, if any); a model whose replies depend on where they are asked
    (addressed scripted replies, see `agent.protocols.Addressed`) is told where."""
    offered: dict[str, Any] = {} if tools is None else {"tools": tools}
    query_at = getattr(model, "query_at", None)
    if query_at is not None:
        return query_at(messages, at, **offered)
    return model.query(messages, **offered)


class Asked(NamedTuple):
    reply: ModelReply
    call_id: str


def ask_logged(env: EpisodeEnv, spec: EpisodeSpec, messages: list[Message], at: Address,
               tools: list[ToolSpec] | None = None) -> Asked:
    """The query, logged in `calls.jsonl` before it is sent and when it ends, so a process killed
    before its turn is written still leaves the call for resume to count. A call offered `tools`
    (the tool-using agent) keeps its reply in the log: the tool it asks for runs after the line
    is written, and a resumed run uses the reply instead of asking again."""
    where = dict(run_id=env.run_id, call_id=uuid.uuid4().hex, episode_key=spec.key,
                 problem_id=spec.problem.id, episode=spec.episode, turn=at.turn)
    env.sink.append_call(CallRecord(phase="sent", **where))
    try:
        reply = ask(env.model, messages, at, tools)
    except InfraFault:
        env.sink.append_call(CallRecord(phase="failed", **where))  # closed: never charged
        raise
    env.sink.append_call(CallRecord(phase="answered", spend=Spend.of_reply(reply),
                                    reply=reply if tools is not None else None, **where))
    return Asked(reply, where["call_id"])


def feedback_vars(state: EpisodeState, result: EvalResult | None, fault: ModelFaultInfo | None,
                  agent: AgentConfig, precision: str = "fp32",
                  tool_mode: bool = False) -> dict[str, Any]:
    """The one dict every feedback template renders from (`precision`: the run's, for the
    speed-of-light bound of a correct result timed on a GPU; `tool_mode`: the result of a
    tool-using agent's `evaluate` call, which speaks of steps and asks for no code block)."""
    total = len(state.spec.prefix) + state.spec.max_turns
    position = state.position
    history = [*state.history(), history_row(position, result)]
    return {
        "turn": position,
        "max_turns": total,
        "turns_left": total - position,
        "backend": agent.backend,
        "result": result,
        "fault": fault,
        "history": history,
        "max_chars": agent.feedback_max_chars,
        "profile_feedback": agent.profile_feedback,
        "tool_mode": tool_mode,
        "bound": (bound_of(cost_of(state.spec.problem), result, precision) if result is not None
                  else Bound(None)),
        "below_clock_resolution": below_clock_resolution(result),
    }


def below_clock_resolution(result: EvalResult | None) -> bool:
    """Whether the evaluator flagged the model's time as below its clock's resolution."""
    return result is not None and any(f.startswith("below_clock_resolution") for f in result.flags)


def feedback_template(result: EvalResult | None) -> str:
    return "feedback_format_error" if result is None else f"feedback_{result.status}"


def head_to_head_of(evaluator: Evaluator, problem: Problem) -> Measure | None:
    """The evaluator's head-to-head (`evaluator.harness.pipeline.head_to_head`) for a close call, where
    it offers one: the challenger judged again with the incumbent timed beside it in the same
    paired rounds. An evaluator fault leaves the call unsettled (the incumbent stays)."""
    compare = getattr(evaluator, "head_to_head", None)
    if compare is None:
        return None

    def measure(incumbent: TurnRecord, challenger: TurnRecord):
        start = time.monotonic()
        try:
            result = compare(problem, challenger.code, incumbent.code)
        except InfraFault:
            return None, time.monotonic() - start, 0.0
        return result.head_to_head, time.monotonic() - start, result.held_s
    return measure


def decide_best(state: EpisodeState, rec: TurnRecord, evaluator: Evaluator, meter: Meter) -> None:
    """Record on `rec` whether it replaces the episode's best kernel; a head-to-head that
    settled a close call is charged to the turn's and the run's eval and GPU seconds."""
    rec.best_decision = state.decide(rec, head_to_head_of(evaluator, state.spec.problem))
    d = rec.best_decision
    if d is not None and d.head_to_head_s is not None:
        extra = Spend(eval_s=d.head_to_head_s, gpu_s=d.head_to_head_gpu_s or 0.0)
        meter.charge(extra)
        rec.spend = rec.spend + extra


def keep_turn(env: EpisodeEnv, state: EpisodeState, rec: TurnRecord, meter: Meter) -> None:
    """A finished turn, in the order resume relies on: whether it replaces the best kernel,
    then on disk, then in the episode's state (and the run's progress)."""
    decide_best(state, rec, env.evaluator, meter)
    env.sink.append_turn(rec)
    state.add(rec)
    if env.on_turn is not None:
        env.on_turn(rec)


def episode_record(env: EpisodeEnv, spec: EpisodeSpec, state: EpisodeState,
                   stop: tuple[StopReason, str | None], unrecorded: Spend,
                   unrecorded_calls: list[str], error: ErrorInfo | None,
                   started_at: str) -> EpisodeRecord:
    """The episode's line in episodes.jsonl, from its turns and why it stopped."""
    reason, detail = stop
    return EpisodeRecord(
        run_id=env.run_id, episode_key=spec.key, episode=spec.episode,
        problem_id=spec.problem.id, problem_stem=spec.problem.stem,
        problem_sha256=spec.problem.sha256, sample=spec.sample, round=spec.round,
        parent=spec.parent, turns=len(state.own), statuses=[r.status for r in state.own],
        stop_reason=reason, stop_detail=detail, best=state.best,
        spend=state.spend + unrecorded, unrecorded_spend=unrecorded,
        unrecorded_calls=unrecorded_calls, error=error,
        started_at=started_at, finished_at=utcnow(),
    )
