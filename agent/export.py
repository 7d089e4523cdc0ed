"""Training data out of a run directory: `kloop export RUN --format messages|parquet`.

One record per turn (or per episode): the chat messages exactly as the model saw them plus its
reply, the verdict, the speedup with its interval, and a reward. Only the fields below leave the
run: no raw provider responses, no config (base URLs, keys), no evaluation internals (the salt
of the hidden input seeds, per-trial seeds). Text that still holds a secret the run knows of
(the configured base URL, a provider key in the environment, the eval salt) is redacted.

The reward is the one function `KernelEnv` pays (`agent.rl.reward`), with the export's weights
(`EXPORT_REWARD`):

    format error (no usable kernel)    format_error   -0.5
    rejected (an anti-cheat rule)      rejected       -1.0
    any other failure                  0.0
    correct                            log(speedup vs eager), unclipped; 0 where no speedup was
                                       measured (CPU: host clocks)
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
)

from kloop.agent.models.base import Message
from kloop.agent.records import TurnRecord
from kloop.agent.rl.reward import RewardConfig
from kloop.agent.rl.reward import reward as rl_reward
from kloop.agent.store import RunStore
from kloop.agent.tally import speedup_interval
from kloop.errors import KloopError
from kloop.evaluator.common.result import EvalResult

EXPORT_SCHEMA_VERSION = 1
_KEY_ENV = ("OPENAI_API_KEY", "ANTHROPIC_API_KEY")
REDACTED = "[redacted]"


class ExportError(KloopError):
    """An export that cannot be written as asked."""


EXPORT_REWARD = RewardConfig(correct=0.0, baseline="eager", log_clip=math.inf)
"""The export's weights for the one reward function (`agent.rl.reward`): 0 for a failed kernel,
log(speedup vs eager), unclipped, for a correct one, -1 rejected, -0.5 a reply without a kernel."""


def reward(result: EvalResult | None, cfg: RewardConfig = EXPORT_REWARD) -> float:
    """The reward of one turn's verdict (None: a format error): `agent.rl.reward.reward`, which
    `KernelEnv` pays, with the export's weights unless others are given."""
    return rl_reward(result, cfg)


class ChatMessage(Message):
    """A run's message as training data: the same fields and the same lean form (a plain
    message is {role, content}), closed to anything else."""

    model_config = ConfigDict(extra="forbid")

    @classmethod
    def of(cls, m: Message, clean: _Redactor) -> ChatMessage:
        calls = [c.model_copy(update={"arguments": clean(c.arguments)}) for c in m.tool_calls]
        return cls(role=m.role, content=clean(m.content), tool_calls=calls,
                   tool_call_id=m.tool_call_id)


class Interval(BaseModel):
    model_config = ConfigDict(extra="forbid")

    lo: float
    hi: float


class TurnExample(BaseModel):
    """One turn as training data."""

    model_config = ConfigDict(extra="forbid")

    schema_version: int = EXPORT_SCHEMA_VERSION
    kind: Literal["turn"] = "turn"
    run_id: str
    problem_id: str
    episode: int
    turn: int
    model: str
    messages: list[ChatMessage]
    """What the model was sent, then its reply (the last, `assistant`)."""
    verdict: str
    """`EvalResult.status`, or `format_error` for a reply without a usable kernel."""
    speedup_vs_eager: float | None = None
    speedup_ci: Interval | None = None
    """The 95 % bootstrap interval of `speedup_vs_eager` over the paired rounds
    (`EvalResult.speedup_ci["eager"]`); None where the speedup has none."""
    comparable: bool | None = None
    """False: timed with a host clock (CPU), no speedup; None: not timed."""
    reward: float
    feedback: str
    """What the model was told about this turn (the next turn's last user message)."""


class EpisodeExample(BaseModel):
    """One episode as training data: the conversation of its last turn, every turn's verdict."""

    model_config = ConfigDict(extra="forbid")

    schema_version: int = EXPORT_SCHEMA_VERSION
    kind: Literal["episode"] = "episode"
    run_id: str
    problem_id: str
    episode: int
    model: str
    messages: list[ChatMessage]
    """The last turn's messages and reply (older turns as the context policy showed them)."""
    verdicts: list[str]
    rewards: list[float]
    speedups_vs_eager: list[float | None] = Field(default_factory=list)
    reward: float
    """The best turn's reward (the episode's kernel is its best one)."""


def _interval(result: EvalResult | None) -> Interval | None:
    """The 95 % interval of `speedup_vs_eager` over the paired rounds, where the result has one."""
    ci = speedup_interval(result)
    return Interval(lo=ci.low, hi=ci.high) if ci is not None else None


class _Redactor:
    def __init__(self, secrets: Iterable[str | None]):
        self.secrets = sorted({s for s in secrets if s and len(s) >= 6}, key=len, reverse=True)

    def __call__(self, text: str) -> str:
        for s in self.secrets:
            text = text.replace(s, REDACTED)
        return text


def _redactor(store: RunStore) -> _Redactor:
    cfg = store.config_record().config
    return _Redactor([cfg.model.base_url, cfg.eval.salt, *(os.environ.get(k) for k in _KEY_ENV)])


def _turn(t: TurnRecord, clean: _Redactor, rewards: RewardConfig) -> TurnExample:
    ev = t.eval
    msgs = [ChatMessage.of(m, clean) for m in t.messages]
    msgs.append(ChatMessage.of(Message(role="assistant", content=t.reply.text,
                                       tool_calls=t.reply.tool_calls), clean))
    return TurnExample(
        run_id=t.run_id, problem_id=t.problem_id, episode=t.episode, turn=t.turn,
        model=t.reply.model, messages=msgs, verdict=t.status,
        speedup_vs_eager=ev.speedup_vs_eager if ev else None, speedup_ci=_interval(ev),
        comparable=ev.timing.comparable if ev and ev.timing else None,
        reward=reward(ev, rewards), feedback=clean(t.feedback))


def examples(run_dir: Path, per: Literal["turn", "episode"] = "turn",
             rewards: RewardConfig = EXPORT_REWARD) -> Iterator[TurnExample | EpisodeExample]:
    """The run's turns (or episodes) as training records, in (problem, episode, turn) order:
    those with a verdict or a model fault. A tool-using agent's steps that judged nothing
    (`problem()`, a profile or submit of a kernel judged earlier) have no reward to give and are
    left out as records; the conversation of each later step still holds them."""
    store = RunStore.open(run_dir)
    clean = _redactor(store)
    turns = sorted((t for t in store.turns() if t.eval is not None or t.fault is not None),
                   key=lambda t: (t.problem_id, t.episode, t.turn))
    rows = [_turn(t, clean, rewards) for t in turns]
    if per == "turn":
        yield from rows
        return
    by_episode: dict[tuple[str, int], list[TurnExample]] = {}
    for r in rows:
        by_episode.setdefault((r.problem_id, r.episode), []).append(r)
    for (pid, episode), rs in by_episode.items():
        yield EpisodeExample(
            run_id=rs[-1].run_id, problem_id=pid, episode=episode, model=rs[-1].model,
            messages=rs[-1].messages, verdicts=[r.verdict for r in rs],
            rewards=[r.reward for r in rs], speedups_vs_eager=[r.speedup_vs_eager for r in rs],
            reward=max(r.reward for r in rs))


def export(run_dir: Path, out: Path, fmt: Literal["messages", "parquet"],
           per: Literal["turn", "episode"] = "turn", rewards: RewardConfig = EXPORT_REWARD) -> int:
    """Write the records to `out` (JSONL, or Parquet through pyarrow); returns how many."""
    records = list(examples(run_dir, per, rewards))
    out.parent.mkdir(parents=True, exist_ok=True)
    if fmt == "messages":
        with out.open("w", encoding="utf-8") as f:
            for r in records:
                f.write(r.model_dump_json() + "\n")
        return len(records)
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError:
        raise ExportError('--format parquet needs pyarrow: pip install -e ".[export]" '
                          'in the kloop clone') from None
    rows = [json.loads(r.model_dump_json()) for r in records]
    pq.write_table(pa.Table.from_pylist(rows), out)
    return len(records)
