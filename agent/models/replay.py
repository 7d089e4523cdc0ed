"""`replay:<run-dir>`: answers with the replies recorded in a run, without any API call.

A query gets the recorded reply whose prompt matches: first exactly, then ignoring the feedback
messages (the evaluator may judge a kernel differently today, so the feedback, and with it the
prompt, can change while the model's earlier replies stay the same). Identical prompts (the
first turn of several samples) get their replies in recorded order. Each recorded reply is given
out once; a query with no reply left raises `ScriptExhausted`, which ends that episode.

A turn's query has a third fallback: the reply recorded at the same problem, episode and turn
after the same replies of the model, whatever kloop's own text around them says (the system,
task and feedback templates change between kloop versions; a run recorded before must replay).

Summary calls (the `summary` context policy) are served the same way, with one more fallback:
the reply recorded at the same problem, episode and turn. Their prompt quotes the feedback
whole, so a changed verdict changes it, while the summary the run went on with stays the same.
"""

from __future__ import annotations

import hashlib
import json
import threading
from pathlib import Path

from kloop.agent.errors import ScriptExhausted
from kloop.agent.models.base import Address, Message, ModelConfig, ModelReply, ToolSpec


def _digest(parts: list[tuple]) -> str:
    return hashlib.sha256(json.dumps(parts).encode()).hexdigest()


def _part(m: Message) -> tuple:
    """A message as hashed: role and text, and the tool calls or call id where it has them."""
    if not m.tool_calls and m.tool_call_id is None:
        return (m.role, m.content)
    return (m.role, m.content, [c.model_dump() for c in m.tool_calls], m.tool_call_id)


def exact_key(messages: list[Message]) -> str:
    return _digest([_part(m) for m in messages])


def replies_key(at: Address, messages: list[Message]) -> str:
    """Where a query is asked and what the model said before it: none of kloop's own text."""
    return _digest([("at", at.model_dump_json())] +
                   [_part(m) for m in messages if m.role == "assistant"])


def loose_key(messages: list[Message]) -> str:
    """The prompt without the feedback (user turns after the task, tool results): opening
    messages and the model's own replies."""
    first_user = next((i for i, m in enumerate(messages) if m.role == "user"), len(messages))
    kept = [_part(m) for i, m in enumerate(messages)
            if i <= first_user or m.role not in ("user", "tool")]
    return _digest(kept)


class ReplayModel:
    """Serves recorded (messages, reply) pairs, each once."""

    def __init__(self, recorded: list[tuple[list[Message], ModelReply]], name: str = "replay",
                 summaries: dict[Address, int] | None = None,
                 turns: dict[int, Address] | None = None):
        """`summaries`: the index in `recorded` of the summary call made at each address;
        `turns`: the address of each turn's query, by its index in `recorded`."""
        self.name = name
        self._summaries = summaries or {}
        self._addressed: dict[str, list[int]] = {}
        for i, at in (turns or {}).items():
            self._addressed.setdefault(replies_key(at, recorded[i][0]), []).append(i)
        self._replies = [reply for _, reply in recorded]
        self._used = [False] * len(recorded)
        self._exact: dict[str, list[int]] = {}
        self._loose: dict[str, list[int]] = {}
        for i, (messages, _) in enumerate(recorded):
            self._exact.setdefault(exact_key(messages), []).append(i)
            self._loose.setdefault(loose_key(messages), []).append(i)
        self._lock = threading.Lock()

    @classmethod
    def from_run(cls, run_dir: str | Path) -> ReplayModel:
        from kloop.agent.store import RunStore

        store = RunStore.open(Path(run_dir))
        turns = sorted(store.turns(), key=lambda t: (t.problem_id, t.episode, t.turn))
        recorded: list[tuple[list[Message], ModelReply]] = []
        summaries: dict[Address, int] = {}
        addressed: dict[int, Address] = {}
        for t in turns:
            if t.summary is not None:
                at = Address(problem=t.problem_id, episode=t.episode, turn=t.turn, call="summary")
                summaries[at] = len(recorded)
                recorded.append((t.summary.messages, t.summary.reply))
            addressed[len(recorded)] = Address(problem=t.problem_id, episode=t.episode, turn=t.turn)
            recorded.append((t.messages, t.reply))
        return cls(recorded, name=f"replay:{run_dir}", summaries=summaries, turns=addressed)

    @classmethod
    def from_spec(cls, arg: str, cfg: ModelConfig) -> ReplayModel:
        """The registry's entry point for `replay:<run-dir>`."""
        return cls.from_run(arg)

    @property
    def remaining(self) -> int:
        return self._used.count(False)

    def restore(self, replies: list[ModelReply]) -> None:
        """Mark the replies a resumed run already holds as given out (see `Resumable`)."""
        with self._lock:
            for reply in replies:
                i = next((i for i, r in enumerate(self._replies) if not self._used[i] and r == reply), None)
                if i is not None:
                    self._used[i] = True

    def _take(self, index: dict[str, list[int]], key: str) -> int | None:
        for i in index.get(key, []):
            if not self._used[i]:
                self._used[i] = True
                return i
        return None

    def query_at(self, messages: list[Message], at: Address,
                 tools: list[ToolSpec] | None = None) -> ModelReply:
        """A turn's query as `query`; a summary call falls back to the reply recorded at `at`."""
        if at.call == "summary":
            with self._lock:
                i = self._take(self._exact, exact_key(messages))
                if i is None and (j := self._summaries.get(at)) is not None and not self._used[j]:
                    self._used[j] = True
                    i = j
                if i is not None:
                    return self._replies[i]
            return self.query(messages)
        with self._lock:
            i = self._take(self._exact, exact_key(messages))
            if i is None:
                i = self._take(self._loose, loose_key(messages))
            if i is None:
                i = self._take(self._addressed, replies_key(at, messages))
            if i is not None:
                return self._replies[i]
        return self.query(messages)  # says why nothing matched

    def query(self, messages: list[Message], tools: list[ToolSpec] | None = None) -> ModelReply:
        with self._lock:
            i = self._take(self._exact, exact_key(messages))
            if i is None:
                i = self._take(self._loose, loose_key(messages))
            if i is None:
                raise ScriptExhausted(
                    f"{self.name}: no recorded reply for this prompt (the trajectory diverged "
                    "from the recorded one, or its replies are used up)"
                )
            return self._replies[i]
