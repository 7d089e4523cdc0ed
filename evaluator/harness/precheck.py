"""Checks that need neither a GPU nor a child process, run before anything that does.

A candidate that is not UTF-8 text, is empty, or defines no `class ModelNew` cannot pass, and
a constant override that names nothing in the problem would only fail inside the reference
worker; both used to cost the reference and baseline stages (tens of seconds) before saying so.
Everything here reads source with `ast` and never executes it.
"""

from __future__ import annotations

import ast
import math
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict

from kloop.errors import KloopError

SourceFault = Literal["not_utf8", "empty", "syntax", "no_model_new"]


class SourceProblem(BaseModel):
    """Why a candidate source cannot be a candidate (a verdict for the model, data for the user)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    kind: SourceFault
    message: str


class CandidateUnreadable(KloopError):
    """A candidate file that cannot be read as text (a user error, not a verdict)."""


class UnknownConstant(KloopError):
    """A problem constant override (`--set NAME=VALUE`) that names no module-level constant."""


def precheck_source(source: str | bytes) -> SourceProblem | None:
    """The first reason `source` cannot define a candidate, or None if it may.

    Bytes are decoded as UTF-8 first (the evaluator writes candidates as UTF-8 files).
    """
    if isinstance(source, bytes):
        try:
            source = source.decode("utf-8")
        except UnicodeDecodeError as e:
            return SourceProblem(kind="not_utf8",
                                 message=f"not UTF-8 text (byte {e.start}: {e.reason})")
    if not source.strip():
        return SourceProblem(kind="empty", message="the candidate source is empty")
    try:
        tree = ast.parse(source)
    except SyntaxError as e:
        return SourceProblem(kind="syntax", message=f"{e.msg} (line {e.lineno})")
    if not any(isinstance(n, ast.ClassDef) and n.name == "ModelNew" for n in tree.body):
        return SourceProblem(kind="no_model_new",
                             message="no top-level `class ModelNew` (the candidate must define it)")
    return None


def module_constants(source: str) -> set[str]:
    """Names bound by top-level assignments of a problem file (what an override may replace)."""
    names: set[str] = set()
    for node in ast.parse(source).body:
        targets = node.targets if isinstance(node, ast.Assign) else (
            [node.target] if isinstance(node, ast.AnnAssign) else [])
        for target in targets:
            for leaf in ast.walk(target):
                if isinstance(leaf, ast.Name):
                    names.add(leaf.id)
    return names


def check_overrides(problem_source: str, overrides: dict[str, Any], where: str) -> None:
    """Raise `UnknownConstant` naming the overrides that `problem_source` does not define."""
    known = module_constants(problem_source)
    unknown = sorted(set(overrides) - known)
    if unknown:
        raise UnknownConstant(
            f"{where}: no module-level constant {', '.join(map(repr, unknown))} to override "
            f"(it has: {', '.join(sorted(known)) or 'none'})")


def source_with_constants(problem_source: str, overrides: dict[str, Any]) -> str:
    """`problem_source` with each overridden module constant's assigned value replaced by the
    override, so what a reader (the model) sees is what is judged; the rest is left as written."""
    if not overrides:
        return problem_source
    lines = problem_source.splitlines(keepends=True)
    edits: list[tuple[int, int, int, int, str]] = []
    for node in ast.parse(problem_source).body:
        if (isinstance(node, ast.Assign) and len(node.targets) == 1
                and isinstance(node.targets[0], ast.Name) and node.targets[0].id in overrides):
            value = node.value
        elif (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)
              and node.target.id in overrides and node.value is not None):
            value = node.value
        else:
            continue
        name = node.targets[0].id if isinstance(node, ast.Assign) else node.target.id
        assert value.end_lineno is not None and value.end_col_offset is not None
        edits.append((value.lineno, value.col_offset, value.end_lineno, value.end_col_offset,
                      repr(overrides[name])))
    # From the end backwards, so earlier positions stay valid. Offsets are in UTF-8 bytes.
    for start_line, start_col, end_line, end_col, text in sorted(edits, reverse=True):
        head = lines[start_line - 1].encode()[:start_col].decode()
        tail = lines[end_line - 1].encode()[end_col:].decode()
        lines[start_line - 1:end_line] = [head + text + tail]
    return "".join(lines)


# `--size small`: which module constants keep their value. Spatial sizes feed pooling chains and
# flattened linear layers, and counts/geometry change what the model computes, so shrinking them
# would break a problem or turn it into another one; feature and channel widths scale freely.
_KEEP = ("height", "width", "image", "resolution", "length", "kernel", "stride", "padding",
         "dilation", "groups", "heads", "num_", "layers", "depth", "dim_head", "window", "patch")
SMALL_DIVISOR = 32
SMALL_FLOOR = 16


def _kept(name: str) -> bool:
    return any(k in name for k in _KEEP)


def _shrink(name: str, value: int, kept: set[int]) -> int:
    if "batch" in name:
        return min(value, 2)
    if _kept(name) or value <= SMALL_FLOOR:
        return value
    # Whatever divided the width before (8, a kept group or head count) divides it after.
    step = math.lcm(*([d for d in kept | {8} if d > 1 and value % d == 0] or [1]))
    small = max(SMALL_FLOOR, value // SMALL_DIVISOR)
    return max(step, small - small % step)


def small_overrides(problem_source: str) -> dict[str, Any]:
    """Constant overrides that shrink a problem for CPU use (`--size small`).

    Batch sizes become at most 2; integer widths above 16 (and lists of them, like an MLP's
    `layer_sizes`) are divided by 32, keeping multiples of 8; spatial sizes, kernel geometry and
    counts are kept (see `_KEEP`). Reference and candidate get the same values.
    """
    constants: dict[str, Any] = {}
    for node in ast.parse(problem_source).body:
        if (isinstance(node, ast.Assign) and len(node.targets) == 1
                and isinstance(node.targets[0], ast.Name)):
            try:
                constants[node.targets[0].id] = ast.literal_eval(node.value)
            except ValueError:
                continue
    # Every constant that stays as it is may be a divisor the model relies on (groups, heads,
    # an expansion ratio): the shrunk widths stay multiples of those they were multiples of.
    kept = {v for k, v in constants.items()
            if _is_int(v) and _shrink(k.lower(), v, set()) == v}
    out: dict[str, Any] = {}
    for name, value in constants.items():
        key = name.lower()
        if _is_int(value):
            new: Any = _shrink(key, value, kept)
        elif isinstance(value, list | tuple) and value and all(map(_is_int, value)):
            new = type(value)(_shrink(key, v, kept) for v in value)
        else:
            continue
        if new != value:
            out[name] = list(new) if isinstance(new, tuple) else new
    return out


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)
