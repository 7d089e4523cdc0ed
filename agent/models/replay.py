"""`replay:<run-dir>`: answers with the replies recorded in a run, without any API call.

A query gets the recorded reply whose prompt matches: first exactly, then ignoring the feedback
messages (the evaluator may judge a kernel differently today, so the feedback, and with it the
prompt, can change while the model's earlier replies stay the same). Identical prompts (the
first turn of several samples) get their replies in recorded order. Each recorded reply is given
out once; a query with no reply left raises `ScriptExhausted`, which ends that episode.
"""

from __future__ import annotations

import hashlib
import json
import threading
from pathlib import Path

from agent.errors import ScriptExhausted
from agent.models.base import Message, ModelConfig, ModelReply


def _digest(parts: list[tuple[str, str]]) -> str:
    return hashlib.sha256(json.dumps(parts).encode()).hexdigest()


def exact_key(messages: list[Message]) -> str:
    return _digest([(m.role, m.content) for m in messages])


def loose_key(messages: list[Message]) -> str:
    """The prompt without the feedback: opening messages and the model's own replies."""
    first_user = next((i for i, m in enumerate(messages) if m.role == "user"), len(messages))
    kept = [
        (m.role, m.content) for i, m in enumerate(messages) if i <= first_user or m.role != "user"
    ]
    return _digest(kept)


class ReplayModel:
    """Serves recorded (messages, reply) pairs, each once."""

    def __init__(self, recorded: list[tuple[list[Message], ModelReply]], name: str = "replay"):
        self.name = name
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
        from agent.store import RunStore

        store = RunStore.open(Path(run_dir))
        turns = sorted(store.turns(), key=lambda t: (t.problem_id, t.episode, t.turn))
        return cls([(t.messages, t.reply) for t in turns], name=f"replay:{run_dir}")

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

    def query(self, messages: list[Message]) -> ModelReply:
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
