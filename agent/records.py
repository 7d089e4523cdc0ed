"""The records a run writes: one TurnRecord per turn, one EpisodeRecord per finished episode.

Both are appended to JSONL files and never rewritten (see agent/store.py). Bump
`TRAJECTORY_SCHEMA_VERSION` on any change that breaks reading old runs.
"""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from agent.budget import Spend
from agent.models.base import Message, ModelReply
from evaluator.result import ErrorInfo, EvalResult

TRAJECTORY_SCHEMA_VERSION = 1

StopReason = Literal["max_turns", "solved", "budget", "format_errors", "infra_error"]


def utcnow() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="milliseconds")


class _Record(BaseModel):
    model_config = ConfigDict(extra="forbid")


class TurnRef(_Record):
    """A turn of an episode: where a beam child or a fork starts from."""

    episode_key: str
    turn: int


class ModelFaultInfo(_Record):
    """Why a reply held no usable kernel (a model fault: it becomes feedback and counts as a turn)."""

    type: str
    message: str


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
    messages: list[Message]
    """Exactly what the model was sent."""
    reply: ModelReply
    """Text, reasoning, usage, cost, finish reason, latency, retries and the raw response."""
    fault: ModelFaultInfo | None = None
    code: str | None = None
    code_sha256: str | None = None
    kernel_path: str | None = None
    """The kernel file, relative to the run directory."""
    eval: EvalResult | None = None
    feedback: str
    spend: Spend
    """What this turn cost: the call, its tokens and dollars, evaluation and wall seconds."""
    started_at: str
    finished_at: str

    @property
    def status(self) -> str:
        return self.eval.status if self.eval is not None else "format_error"


class BestKernel(_Record):
    """The correct kernel with the lowest median runtime."""

    turn: int
    kernel_path: str
    code_sha256: str
    runtime_ms: float | None
    speedup_vs_eager: float | None = None
    speedup_vs_compile: float | None = None
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
    """The turn this episode continues (beam children); its history is the model's context."""
    turns: int
    statuses: list[str] = Field(default_factory=list)
    stop_reason: StopReason
    stop_detail: str
    best: BestKernel | None = None
    spend: Spend
    unrecorded_spend: Spend = Spend()
    """Spend of a call whose turn could not be finished (infrastructure error): paid, not logged as a turn."""
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


class RunSummary(_Record):
    """Derived from the JSONL files; rewritten whenever the run advances."""

    schema_version: int = TRAJECTORY_SCHEMA_VERSION
    run_id: str
    status: Literal["running", "finished", "budget", "interrupted"]
    stop_detail: str | None = None
    problems: list[ProblemSummary]
    spend: Spend
    updated_at: str
