"""The trust boundary shows in the tree (docs/architecture.md#layout):

- `worker/` runs in worker processes, next to candidate code;
- `harness/`, `procs/` and `tools/` run only in the harness;
- `common/` (records, wire formats, pure functions) and `build/` have no side.

Code that runs beside candidate code never imports the harness's, so nothing a worker computes
can be a verdict. No trusted module imports worker code, so the harness never runs what a worker
runs. Every module of the evaluator sits in exactly one of these folders. Imports are read from
the syntax tree, lazy ones inside functions included."""

from __future__ import annotations

import ast
from pathlib import Path

from kloop import evaluator

ROOT = Path(evaluator.__file__).parent
SIDES = {"worker": "worker", "harness": "trusted", "procs": "trusted", "tools": "trusted",
         "common": "none", "build": "none"}
ALLOWED = {
    # where each folder's modules may import from (kloop's own modules; anything else is free)
    "worker": {"worker", "common", "build", "kloop.problems"},
    "common": {"common"},
    "build": {"common", "build"},
    "harness": {"harness", "procs", "common", "build", "kloop.problems"},
    "procs": {"procs", "common", "build", "harness", "kloop.problems"},
    "tools": {"tools", "harness", "procs", "common", "build", "kloop.problems"},
}


def _imports(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
            names.update(f"{node.module}.{a.name}" for a in node.names)
        elif isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
    return names


def _folder_of(name: str) -> str | None:
    """`kloop.evaluator.<folder>...` -> folder; `kloop.problems...` -> itself; else None."""
    parts = name.split(".")
    if parts[:2] == ["kloop", "evaluator"] and len(parts) > 2 and parts[2] in SIDES:
        return parts[2]
    if parts[:2] == ["kloop", "problems"]:
        return "kloop.problems"
    if parts[:2] in (["kloop", "agent"], ["kloop", "prompts"]):
        return ".".join(parts[:2])
    return None


def _modules(folder: str) -> list[Path]:
    return sorted((ROOT / folder).glob("*.py"))


def test_every_module_of_the_evaluator_is_on_a_side():
    top = {p.name for p in ROOT.glob("*.py")}
    assert top == {"__init__.py"}, top
    folders = {p.name for p in ROOT.iterdir() if p.is_dir() and p.name != "__pycache__"}
    assert folders == set(SIDES)


def test_each_folder_imports_only_what_its_side_may():
    offenders = {}
    for folder, allowed in ALLOWED.items():
        for path in _modules(folder):
            bad = sorted(n for n in _imports(path)
                         if (f := _folder_of(n)) is not None and f not in allowed)
            if bad:
                offenders[f"{folder}/{path.name}"] = bad
    assert offenders == {}


def test_nothing_outside_the_workers_imports_worker_code():
    users = [p for p in ROOT.rglob("*.py") if "worker" not in p.relative_to(ROOT).parts]
    users += list((ROOT.parent / "agent").rglob("*.py"))
    offenders = sorted(str(p.relative_to(ROOT.parent)) for p in users
                       if any(_folder_of(n) == "worker" for n in _imports(p)))
    assert offenders == []


def test_the_boundary_test_sees_imports_and_would_catch_a_crossing(tmp_path):
    assert any(_folder_of(n) == "common" for n in _imports(ROOT / "worker" / "serve.py"))
    assert any(_folder_of(n) == "harness" for n in _imports(ROOT / "harness" / "timed.py"))
    # A lazy import of the harness inside a worker function is a crossing too.
    crossing = tmp_path / "w.py"
    crossing.write_text("def f():\n    from kloop.evaluator.harness import judge\n")
    assert "harness" in {_folder_of(n) for n in _imports(crossing)} - ALLOWED["worker"]
    assert {p.name for p in _modules("worker")} >= {"serve.py", "child.py", "candidate.py",
                                                     "trials.py", "probes.py", "confine.py"}
