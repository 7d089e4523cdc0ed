"""kloop's evaluator: compile, check, time and profile one candidate in isolated processes.

Public API: `evaluate`, `evaluate_many`, `EvalConfig`, `Policy`, `POLICIES`, `get_policy` and
the records in `evaluator.result`. Imports are lazy so that child processes, which import
`evaluator.worker.child`, do not load the harness.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__version__ = "0.2.0"

_EXPORTS = {
    "evaluate": "evaluator.pipeline",
    "evaluate_many": "evaluator.pipeline",
    "EvalConfig": "evaluator.config",
    "Policy": "evaluator.config",
    "POLICIES": "evaluator.config",
    "get_policy": "evaluator.config",
    "UnknownPolicyError": "evaluator.config",
    "EvalResult": "evaluator.result",
    "ReferenceFailure": "evaluator.reference",
}
__all__ = [
    "POLICIES", "EvalConfig", "EvalResult", "Policy", "ReferenceFailure", "UnknownPolicyError",
    "evaluate", "evaluate_many", "get_policy",
]

if TYPE_CHECKING:
    from evaluator.config import POLICIES, EvalConfig, Policy, UnknownPolicyError, get_policy
    from evaluator.pipeline import evaluate, evaluate_many
    from evaluator.reference import ReferenceFailure
    from evaluator.result import EvalResult


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        import importlib

        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'evaluator' has no attribute {name!r}")
