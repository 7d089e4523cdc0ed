"""The components the loop talks to, as small protocols. Run scripts pick the concrete classes.

`Model` lives with the providers (agent/models/base.py) and is re-exported here so the loop's
three collaborators are in one place.
"""

from __future__ import annotations

from typing import Protocol

from agent.models.base import Model
from evaluator.result import EvalResult
from problems.registry import Problem

__all__ = ["Evaluator", "Model", "ProblemSource"]


class Evaluator(Protocol):
    """Judges one candidate source for one problem.

    Candidate faults (syntax errors, crashes, wrong outputs, timeouts) come back as an
    `EvalResult`; only a failure of the evaluator itself raises (`agent.errors.EvalInfraError`).
    """

    def evaluate(self, problem: Problem, source: str) -> EvalResult: ...


class ProblemSource(Protocol):
    """Resolves problem ids (`L3/4`, `4_LeNet5`) and levels to problems."""

    def get(self, problem_id: str) -> Problem: ...

    def filter(self, level: int | None = None) -> list[Problem]: ...
