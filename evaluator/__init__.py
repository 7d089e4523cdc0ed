"""kloop's evaluator: compile, check, time and profile one candidate in isolated processes.

Public API: `evaluate`, `evaluate_many`, `EvalConfig`, `Policy`, `POLICIES`, `get_policy` and
the records in `evaluator.common.result`. Imports are lazy so that child processes, which import
`evaluator.worker.child`, do not load the harness.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__version__ = "0.2.0"

_EXPORTS = {
    "evaluate": "kloop.evaluator.harness.pipeline",
    "evaluate_many": "kloop.evaluator.harness.pipeline",
    "EvalConfig": "kloop.evaluator.common.config",
    "Policy": "kloop.evaluator.common.config",
    "POLICIES": "kloop.evaluator.common.config",
    "get_policy": "kloop.evaluator.common.config",
    "UnknownPolicyError": "kloop.evaluator.common.config",
    "EvalResult": "kloop.evaluator.common.result",
    "ReferenceFailure": "kloop.evaluator.harness.reference",
}
__all__ = [
    "POLICIES", "EvalConfig", "EvalResult", "Policy", "ReferenceFailure", "UnknownPolicyError",
    "evaluate", "evaluate_many", "get_policy",
]

if TYPE_CHECKING:
    from kloop.evaluator.common.config import (
        POLICIES,
        EvalConfig,
        Policy,
        UnknownPolicyError,
        get_policy,
    )
    from kloop.evaluator.common.result import EvalResult
    from kloop.evaluator.harness.pipeline import evaluate, evaluate_many
    from kloop.evaluator.harness.reference import ReferenceFailure


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        import importlib

        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'kloop.evaluator' has no attribute {name!r}")
