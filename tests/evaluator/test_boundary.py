"""The trust boundary shows in the tree: code that runs in worker processes (next to candidate
code) never imports the harness's, so nothing a worker computes can be a verdict."""

from __future__ import annotations

import ast
from pathlib import Path

from kloop import evaluator

ROOT = Path(evaluator.__file__).parent
# Modules that run inside worker processes (candidate or reference).
WORKER_MODULES = sorted((ROOT / "worker").glob("*.py"))


def _imports(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
        elif isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
    return names


def test_worker_code_never_imports_harness_code():
    offenders = {
        p.name: sorted(n for n in _imports(p) if n.startswith("kloop.evaluator.harness"))
        for p in WORKER_MODULES
    }
    assert {k: v for k, v in offenders.items() if v} == {}


def test_the_boundary_test_sees_an_import():
    sample = ROOT / "harness" / "timed.py"
    assert any(n.startswith("kloop.evaluator.harness") for n in _imports(sample))
    assert {p.name for p in WORKER_MODULES} >= {"serve.py", "child.py", "candidate.py",
                                                "trials.py", "probes.py", "construct.py"}
