"""The records a run writes: one TurnRecord per turn, one EpisodeRecord per finished episode.

Both are appended to JSONL files and never rewritten (see agent/store.py). Bump
`TRAJECTORY_SCHEMA_VERSION` on any change that breaks reading old runs.
"""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from kloop.agent.budget import Spend
from kloop.agent.models.base import Message, ModelReply, ToolCall
from kloop.evaluator.common.result import (
    BaselineName,
    ErrorInfo,
    EvalResult,
    HeadToHead,
    SpeedupInterval,
)

TRAJECTORY_SCHEMA_VERSION = 1
DECISION_SCHEMA_VERSION = 1

StopReason = Literal["max_turns", "solved", "budget", "format_errors", "infra_error", "submitted"]
"""`submitted`: a tool-using agent gave its final answer (`strategy.kind: agent`)."""


def utcnow() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="milliseconds")


class _Record(BaseModel):
    model_config = ConfigDict(extra="forbid")


class TurnRef(_Record):
    """A turn of an episode: where a beam or tree child, or a fork, starts from."""

    episode_key: str
    turn: int


class NodeAddress(_Record):
    """A node of a problem's search tree as `kloop show --tree` names it (`EPISODE:TURN`): the
    episode's index within its problem and the turn's index within that episode."""

    episode: int
    turn: int

    @classmethod
    def parse(cls, text: str) -> NodeAddress:
        episode, sep, turn = text.partition(":")
        if not sep or not episode.strip().isdigit() or not turn.strip().isdigit() or int(turn) < 1:
            raise ValueError(f"{text!r} is not a node address EPISODE:TURN (like 3:1)")
        return cls(episode=int(episode), turn=int(turn))

    def __str__(self) -> str:
        return f"{self.episode}:{self.turn}"


class ModelFaultInfo(_Record):
    """Why a reply held no usable kernel (a model fault: it becomes feedback and counts as a turn)."""

    type: str
    message: str


class SummaryCall(_Record):
    """The model call that condensed older turns before a turn's query (`summary` context policy)."""

    covers: int
    """The first `covers` turns of the trajectory (inherited ones included) are condensed."""
    messages: list[Message]
    """Exactly what the summarising call was sent (prompts/summarize.j2)."""
    reply: ModelReply
    """Its text, usage and cost, as for any call; its spend is part of the turn's `spend`."""
    text: str
    """What the model is shown: the reply's text, or the digest of the same turns when the
    reply was unusable (`fault`)."""
    fault: ModelFaultInfo | None = None


class BestDecision(_Record):
    """Whether a correct kernel replaced the best one so far (`agent.tally.challenge`), kept on
    the turn that offered it. With both speedup intervals (paired timing) the challenger must
    beat the incumbent beyond the noise: its interval's low end above the incumbent's high end.
    Intervals that overlap are too close to call: `agent.tally.settle_close_call` decides, and
    today keeps the incumbent. A side without an interval (CPU, records from before paired
    timing) falls back to the point rule: the lower median runtime wins."""

    schema_version: int = DECISION_SCHEMA_VERSION
    kind: Literal["best_decision"] = "best_decision"
    outcome: Literal["replaced", "kept", "kept_too_close"]
    """replaced: the challenger is the new best; kept: it is not faster (slower beyond the
    noise, or not faster by the point rule); kept_too_close: the intervals overlap."""
    rule: Literal["interval", "point"]
    incumbent: TurnRef
    challenger: TurnRef
    baseline: BaselineName | None = None
    """Which speedup's intervals were compared (the interval rule)."""
    incumbent_interval: SpeedupInterval | None = None
    challenger_interval: SpeedupInterval | None = None
    incumbent_runtime_ms: float | None = None
    challenger_runtime_ms: float | None = None
    head_to_head: HeadToHead | None = None
    """The two kernels timed in the same paired rounds, where the intervals were too close."""
    head_to_head_s: float | None = None
    """Its wall seconds (charged to the run's eval seconds)."""
    head_to_head_gpu_s: float | None = None
    """The seconds it held the device (charged to the run's GPU seconds)."""
    detail: str
    """The decision in words, e.g. `kept: too close to call`."""


class TurnRecord(_Record):
    """One query → extract → evaluate → feedback step, appended to `turns.jsonl`."""

    schema_version: int = TRAJECTORY_SCHEMA_VERSION
    kind: Literal["turn"] = "turn"
    run_id: str
    episode_key: str
    episode: int
    """The episode's index within its problem (also in the kernel file name)."""
    problem_id: str
    problem_stem: str
    turn: int
    """1-based index of this turn within its episode (turns inherited from a parent excluded)."""
    position: int | None = None
    """1-based place of this turn in the trajectory the model saw, inherited turns included: the
    N of the "Turn N of M" its feedback says (a fork's or a beam child's first turn is past 1).
    None in records from before it was kept."""
    parent: TurnRef | None = None
    """The node this turn continues: its episode's previous turn or, for a first turn, the turn the
    episode branched from (beam, tree, fork); None for the first turn of an episode from scratch.
    Records written before this field existed hold None on every turn (see `agent.tree`)."""
    messages: list[Message]
    """Exactly what the model was sent."""
    reply: ModelReply
    """Text, reasoning, usage, cost, finish reason, latency, retries and the raw response."""
    summary: SummaryCall | None = None
    """The summary call made before this turn's query, if one was due (`summary` policy)."""
    fault: ModelFaultInfo | None = None
    call_id: str | None = None
    """The model call of this turn as `calls.jsonl` logs it; None for imports and records
    from before calls were logged."""
    code: str | None = None
    code_sha256: str | None = None
    kernel_path: str | None = None
    """The kernel file, relative to the run directory."""
    eval: EvalResult | None = None
    feedback: str
    """What the model is shown next: the verdict; for a tool step, the tool's result."""
    best_decision: BestDecision | None = None
    """A correct kernel judged against the episode's best so far: whether it replaced it, and
    why; None where there was nothing to compare (no kernel, not correct, or the first correct
    one of its episode). Resume honours it, so a decision is made once."""
    tool: ToolCall | None = None
    """The tool call this step ran (`strategy.kind: agent`): one per step, the first of the
    reply's; None for a turn of the turn loop, and for a step whose reply called no tool."""
    spend: Spend
    """What this turn cost: its calls (the summary call included), their tokens and dollars,
    evaluation and wall seconds."""
    started_at: str
    finished_at: str

    @property
    def status(self) -> str:
        """The verdict; `unevaluated` for a kernel no evaluator has judged yet (an import);
        `info` for an agent's step that judged no kernel (it read the problem or a profile);
        `format_error` for a reply without a kernel or a tool call that ran."""
        if self.eval is not None:
            return self.eval.status
        if self.fault is not None:
            return "format_error"
        if self.code is not None:
            return "unevaluated"
        return "info" if self.tool is not None else "format_error"


CallPhase = Literal["sent", "answered", "failed"]


class CallRecord(_Record):
    """One line of `calls.jsonl`, the run's log of model calls: each turn's (or agent step's)
    call is appended before it is sent (`sent`), then once more when it ended: `answered`, with
    its spend, or `failed` (the provider gave no reply: an infrastructure fault, never charged).

    The log serves two readers. Accounting: a process killed after sending leaves a call no
    turn names; resume folds its spend into the episode's `unrecorded_spend`, so the totals count
    every request the provider saw (`agent.tally.unaccounted_calls`). Resume of a tool-using
    agent: its `answered` line keeps the reply, written before the tool it asks for runs, so a
    run killed while the tool runs (or stopped by an infrastructure fault in it) resumes with
    that reply instead of asking the model again (`agent.agentic`)."""

    schema_version: int = TRAJECTORY_SCHEMA_VERSION
    kind: Literal["call"] = "call"
    run_id: str
    call_id: str
    """The same on every line of one call; the turn that used the reply names it too."""
    episode_key: str
    problem_id: str
    episode: int
    turn: int
    """The turn (agent: step) of its episode the call was made for."""
    phase: CallPhase
    spend: Spend | None = None
    """An `answered` call's tokens and cost."""
    reply: ModelReply | None = None
    """An `answered` call's reply, kept where resume uses it instead of asking again (a
    tool-using agent's step); None for the turn loop, which asks again and whose turn record
    holds the reply."""
    at: str = Field(default_factory=utcnow)


class BestKernel(_Record):
    """The best correct kernel (`agent.tally.best_turn`): the first, replaced by each later one
    that beats it beyond the noise (`BestDecision`)."""

    turn: int
    kernel_path: str
    code_sha256: str
    runtime_ms: float | None
    speedup_vs_eager: float | None = None
    speedup_vs_compile: float | None = None
    speedup_vs_best: float | None = None
    """Against the fastest baseline measured (`EvalResult.best_baseline`)."""
    best_baseline: BaselineName | None = None
    speedup_interval: SpeedupInterval | None = None
    """The 95 % interval of `speedup_vs_eager` over the paired rounds; None without one."""
    comparable: bool
    """False when runtimes come from a host clock (CPU): the pick is by runtime all the same."""


class EpisodeRecord(_Record):
    """One finished episode, appended to `episodes.jsonl`; the last record of a key wins."""

    schema_version: int = TRAJECTORY_SCHEMA_VERSION
    kind: Literal["episode"] = "episode"
    run_id: str
    episode_key: str
    episode: int
    problem_id: str
    problem_stem: str
    problem_sha256: str
    sample: int
    round: int = 0
    parent: TurnRef | None = None
    """The turn this episode continues (beam and tree children, forks); its history is the
    model's context."""
    turns: int
    statuses: list[str] = Field(default_factory=list)
    stop_reason: StopReason
    stop_detail: str
    best: BestKernel | None = None
    spend: Spend
    unrecorded_spend: Spend = Spend()
    """Spend of calls whose turn could not be finished (an infrastructure error, or a process
    killed between the call and its turn record): paid, not logged as a turn."""
    unrecorded_calls: list[str] = Field(default_factory=list)
    """The `CallRecord.call_id`s whose spend `unrecorded_spend` holds."""
    error: ErrorInfo | None = None
    """The infrastructure error that stopped the episode."""
    started_at: str
    finished_at: str


class ProblemSummary(_Record):
    problem_id: str
    problem_stem: str
    episodes: int
    turns: int
    best: BestKernel | None = None
    best_episode: int | None = None
    stop_reasons: dict[str, int] = Field(default_factory=dict)


class NodeReport(_Record):
    """One node of a Ray cluster as the run used it."""

    node_id: str
    address: str
    hardware: str | None = None
    """The device its workers evaluate on (`NVIDIA H200`, `cpu`); None until one reported."""
    workers: int
    evaluations: int = 0
    """Evaluations that came back from this node (any verdict)."""
    lost: int = 0
    """Evaluations lost with a worker or the node (each re-queued elsewhere)."""
    state: Literal["active", "drained", "lost"] = "active"
    """drained: it lost `executor.drain_after` evaluations and got no more work; lost: the
    cluster reports it dead."""


class ExecutorReport(_Record):
    """Where a run's evaluations went (the ray executor; a local run has none)."""

    kind: Literal["ray"] = "ray"
    address: str | None
    nodes: list[NodeReport] = Field(default_factory=list)
    requeued: int = 0
    """Evaluations started again on another worker after theirs was lost."""

    def gone(self) -> list[NodeReport]:
        return [n for n in self.nodes if n.state != "active"]


class RunSummary(_Record):
    """Derived from the JSONL files; rewritten whenever the run advances."""

    schema_version: int = TRAJECTORY_SCHEMA_VERSION
    run_id: str
    status: Literal["running", "finished", "budget", "interrupted"]
    stop_detail: str | None = None
    problems: list[ProblemSummary]
    spend: Spend
    updated_at: str
    executor: ExecutorReport | None = None
    """The ray executor's nodes: which were used, drained or lost (None for a local run)."""
