"""kloop's evaluator: compile, check, time and profile one candidate in isolated processes.

Public API: `evaluate`, `evaluate_many`, `EvalConfig`, `Policy`, `POLICIES`, `get_policy` and
the records in `evaluator.result`. Imports are lazy so that child processes, which import
`evaluator.worker.child`, do not load the harness.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__version__ = "0.2.0"

_EXPORTS = {
    "evaluate": "kloop.evaluator.pipeline",
    "evaluate_many": "kloop.evaluator.pipeline",
    "EvalConfig": "kloop.evaluator.config",
    "Policy": "kloop.evaluator.config",
    "POLICIES": "kloop.evaluator.config",
    "get_policy": "kloop.evaluator.config",
    "UnknownPolicyError": "kloop.evaluator.config",
    "EvalResult": "kloop.evaluator.result",
    "ReferenceFailure": "kloop.evaluator.reference",
}
__all__ = [
    "POLICIES", "EvalConfig", "EvalResult", "Policy", "ReferenceFailure", "UnknownPolicyError",
    "evaluate", "evaluate_many", "get_policy",
]

if TYPE_CHECKING:
    from kloop.evaluator.config import POLICIES, EvalConfig, Policy, UnknownPolicyError, get_policy
    from kloop.evaluator.pipeline import evaluate, evaluate_many
    from kloop.evaluator.reference import ReferenceFailure
    from kloop.evaluator.result import EvalResult


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        import importlib

        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'kloop.evaluator' has no attribute {name!r}")
