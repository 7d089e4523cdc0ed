"""The components the loop talks to, as small protocols. Run scripts pick the concrete classes.

`Model` lives with the providers (agent/models/base.py) and is re-exported here so the loop's
three collaborators are in one place.
"""

from __future__ import annotations

from typing import Protocol

from kloop.agent.models.base import Address, Message, Model, ModelReply, ToolSpec
from kloop.evaluator.common.result import EvalResult
from kloop.problems.registry import Problem

__all__ = ["Addressed", "Evaluator", "Model", "Resumable"]


class Evaluator(Protocol):
    """Judges one candidate source for one problem.

    Candidate faults (syntax errors, crashes, wrong outputs, timeouts) come back as an
    `EvalResult`; only a failure of the evaluator itself raises (`agent.errors.EvalInfraError`).
    """

    def evaluate(self, problem: Problem, source: str) -> EvalResult: ...


class Resumable(Protocol):
    """A model with a position of its own (scripted replies, a replayed run).

    On resume the runner passes the replies already recorded, in file order, so the model
    continues after them instead of starting from its first reply again.
    """

    def restore(self, replies: list[ModelReply]) -> None: ...


class Addressed(Protocol):
    """A model whose replies depend on where they are asked (scripted replies addressed by
    problem, episode and turn). The loop calls `query_at` instead of `query` when a model has
    it; an `ordered` one (replies in query order) makes the runner ask one query at a time."""

    ordered: bool

    def query_at(self, messages: list[Message], at: Address,
                 tools: list[ToolSpec] | None = None) -> ModelReply: ...
