"""`scripted:<file>`: replies written in advance. For tests, demos and replay.

A file is a YAML or JSON list (or a mapping with a `replies` list). Each entry is a string (the
reply text) or a mapping with `text` and optionally `reasoning`, `usage`, `finish_reason`,
`cost_usd`, `model`, `latency_s`, `raw`, `tool_calls` (each `{id, name, arguments}`), `at`. A scripted reply costs 0 unless its entry says
otherwise, so recorded replies can carry their recorded cost into a budget.

Replies are either ordered (returned one per query, in order) or addressed: every entry has
`at: {problem: L3/1, episode: 0, turn: 1}` and is returned to that query wherever it comes in
the run's order. Ordered replies mean something only when queries come one at a time, so a run
with an ordered script runs its episodes one at a time (`ordered`); an addressed one runs at
any concurrency and needs nothing restored on resume.

A mapping file may also say `usage: counted`: entries without usage of their own then get the
prompt and reply counted by `agent.tokens` (marked in `raw`: counted, not provider-reported).
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from pathlib import Path

import yaml
from kloop.agent.errors import ScriptExhausted
from kloop.agent.models.base import Address, Message, ModelConfig, ModelReply, ToolSpec, Usage
from kloop.agent.tokens import COUNTER, count_tokens
from pydantic import ConfigDict, Field, ValidationError


class ScriptedEntry(ModelReply):
    """A `ModelReply` with defaults for everything but the text."""

    model_config = ConfigDict(extra="forbid")

    usage: Usage = Field(default_factory=Usage)
    cost_usd: float | None = 0.0
    finish_reason: str | None = "stop"
    latency_s: float = 0.0
    model: str = "scripted"
    raw: dict = Field(default_factory=dict)
    at: Address | None = None
    """Addressed replies: the query this one answers (never part of the reply itself)."""


class ScriptedModel:
    """Returns `replies` one per query, in order; raises `ScriptExhausted` past the last.

    Thread-safe. `seen` keeps the messages of every query, so a test can check what the model
    was shown.
    """

    def __init__(self, replies: Sequence[str | dict | ModelReply], name: str = "scripted",
                 count_usage: bool = False) -> None:
        self.name = name
        self.count_usage = count_usage
        self._counted = [isinstance(r, str) or (isinstance(r, dict) and "usage" not in r)
                         for r in replies]
        self._replies = [_entry(r, i) for i, r in enumerate(replies)]
        self._at = _addresses(self._replies)
        self._next = 0
        self._lock = threading.Lock()
        self.seen: list[list[Message]] = []

    @classmethod
    def from_file(cls, path: str | Path) -> ScriptedModel:
        path = Path(path)
        try:
            data = yaml.safe_load(path.read_text())
        except OSError as e:
            raise ValueError(f"scripted replies: cannot read {path}: {e}") from e
        except yaml.YAMLError as e:
            raise ValueError(f"scripted replies: {path} is not valid YAML or JSON: {e}") from e
        count = isinstance(data, dict) and data.get("usage") == "counted"
        if isinstance(data, dict) and "replies" in data:
            data = data["replies"]
        if not isinstance(data, list):
            raise ValueError(f"scripted replies: {path} must hold a list of replies")
        return cls(data, name=f"scripted:{path}", count_usage=count)

    @classmethod
    def from_spec(cls, arg: str, cfg: ModelConfig) -> ScriptedModel:
        """The registry's entry point for `scripted:<file>`."""
        return cls.from_file(arg)

    @property
    def remaining(self) -> int:
        return len(self._replies) - self._next

    @property
    def ordered(self) -> bool:
        """Replies given in query order (not addressed): queries must come one at a time."""
        return self._at is None

    def restore(self, replies: list[ModelReply]) -> None:
        """Continue after the replies a resumed run already holds (see `Resumable`)."""
        if self._at is not None:
            return  # addressed: every query finds its own reply, resumed or not
        indices = [r.raw.get("scripted", {}).get("index") for r in replies]
        known = [i for i in indices if isinstance(i, int)]
        # Entries with a raw body of their own carry no index: count them instead.
        position = max(known) + 1 if len(known) == len(indices) else len(replies)
        with self._lock:
            self._next = max(self._next, min(position, len(self._replies)))

    def query_at(self, messages: list[Message], at: Address,
                 tools: list[ToolSpec] | None = None) -> ModelReply:
        """The reply addressed to `at` (an ordered script: the next one). `tools` change
        nothing: a scripted reply says which tools it calls (`tool_calls`)."""
        if self._at is None:
            return self.query(messages)
        index = self._at.get(at)
        if index is None:
            raise ScriptExhausted(f"{self.name}: no scripted reply for {at}")
        with self._lock:
            self._next += 1
            self.seen.append(list(messages))
        return self._reply(index, messages)

    def query(self, messages: list[Message], tools: list[ToolSpec] | None = None) -> ModelReply:
        if self._at is not None:
            raise ScriptExhausted(f"{self.name}: its replies are addressed, and this query has "
                                  "no address")
        with self._lock:
            index = self._next
            if index >= len(self._replies):
                raise ScriptExhausted(
                    f"{self.name}: all {len(self._replies)} scripted replies are used up "
                    f"(query {index + 1} has none)"
                )
            self._next += 1
            self.seen.append(list(messages))
        return self._reply(index, messages)

    def _reply(self, index: int, messages: list[Message]) -> ModelReply:
        entry = self._replies[index]
        raw = entry.raw or {"scripted": {"source": self.name, "index": index}}
        update: dict = {"raw": raw}
        if self.count_usage and self._counted[index]:
            update["usage"] = Usage(
                input_tokens=sum(count_tokens(m.content) for m in messages),
                output_tokens=count_tokens(entry.text))
            raw["scripted"]["usage_counted_by"] = COUNTER
        return ModelReply.model_validate({**entry.model_dump(exclude={"at"}), **update})


def _entry(reply: str | dict | ModelReply, index: int) -> ModelReply:
    if isinstance(reply, ModelReply):
        return reply
    try:
        if isinstance(reply, str):
            return ScriptedEntry(text=reply)
        return ScriptedEntry.model_validate(reply)
    except ValidationError as e:
        raise ValueError(f"scripted reply {index}: {e}") from e


def _addresses(entries: list[ModelReply]) -> dict[Address, int] | None:
    """Address -> entry index when the script is addressed; None when it is ordered."""
    ats = [getattr(e, "at", None) for e in entries]
    if all(a is None for a in ats):
        return None
    if any(a is None for a in ats):
        missing = next(i for i, a in enumerate(ats) if a is None)
        raise ValueError(f"scripted reply {missing}: has no `at`, but others do (address every "
                         "reply or none)")
    out: dict[Address, int] = {}
    for i, a in enumerate(ats):
        assert a is not None
        if a in out:
            raise ValueError(f"scripted reply {i}: {a} is already answered by reply {out[a]}")
        out[a] = i
    return out
