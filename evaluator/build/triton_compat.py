"""Compiling, for a real GPU target, kernels that were defined under the Triton interpreter.

With TRITON_INTERPRET=1, `@triton.jit` returns interpreter objects, including for Triton's own
library functions (`tl.zeros`, `tl.cdiv`…), and a launch patches `triton.language` with interpreter
implementations. A kernel call into another `@jit` function patches without restoring (3.7.1),
so after a CPU run e.g. `triton.language.core.mul` stays bound to the interpreter. `compiler_mode()`
gives the AOT compiler the language as it was before the first launch, with every interpreted
function swapped for a JITFunction of the same Python function, and puts the interpreter's state
back afterwards. It relies only on `InterpretedFunction.fn`/`.kwargs` and `JITFunction(fn)`.
"""

from __future__ import annotations

import contextlib
import os
import sys
import types
from collections.abc import Iterator
from typing import Any

_UNSET = object()
_SNAPSHOT: list[tuple[Any, dict[str, Any]]] | None = None
_JIT_OF: dict[int, Any] = {}
"""id(interpreted function) -> its JITFunction (kept for the process: conversion is pure)."""
_GLOBALS_OF: dict[int, dict[str, Any]] = {}
"""id(a module's globals) -> the copy in which interpreted functions are JITFunctions."""


def is_interpreted(obj: Any) -> bool:
    return type(obj).__name__ == "InterpretedFunction" and hasattr(obj, "fn")


def _namespaces() -> list[Any]:
    import triton.language as tl

    mods = [m for name, m in sorted(sys.modules.items())
            if name.startswith("triton.language") and isinstance(m, types.ModuleType)]
    classes = [v for v in vars(tl.core).values()
               if isinstance(v, type) and v.__module__.startswith("triton.language")]
    return [tl, *mods, *classes]


def snapshot_language() -> None:
    """Remember triton.language as it is now: call before the first interpreter launch."""
    global _SNAPSHOT
    if _SNAPSHOT is None:
        _SNAPSHOT = [(ns, {k: _unpatched(v) for k, v in vars(ns).items()})
                     for ns in _namespaces()]


def _unpatched(value: Any) -> Any:
    """The builtin behind an interpreter wrapper left over from an earlier launch (best effort,
    for a snapshot taken too late)."""
    while getattr(value, "__qualname__", "").startswith("_patch_attr.") and isinstance(
        getattr(value, "__kwdefaults__", None), dict
    ) and "member" in value.__kwdefaults__:
        value = value.__kwdefaults__["member"]
    return value


def _set_namespace(ns: Any, wanted: dict[str, Any]) -> dict[str, Any]:
    """Make `ns` hold exactly `wanted` (dunders aside); returns what it held before."""
    current = dict(vars(ns))
    for name in set(current) - set(wanted):
        if not name.startswith("__"):
            delattr(ns, name)
    for name, value in wanted.items():
        if current.get(name, _UNSET) is not value and not name.startswith("__"):
            setattr(ns, name, value)
    return current


def to_jit(fn: Any) -> Any:
    """A JITFunction for `fn` (interpreted, plain, or already JIT). Interpreted functions in its
    globals become JITFunctions too: the code generator only inlines JITFunction callees."""
    from triton.runtime.jit import JITFunction

    if isinstance(fn, JITFunction):
        return fn
    if id(fn) in _JIT_OF:
        return _JIT_OF[id(fn)]
    raw = getattr(fn, "fn", fn)
    g = raw.__globals__
    new_globals = _GLOBALS_OF.get(id(g))
    if new_globals is None:
        new_globals = _GLOBALS_OF[id(g)] = dict(g)
        for name, value in list(g.items()):
            if is_interpreted(value):
                new_globals[name] = to_jit(value)
    copy = types.FunctionType(raw.__code__, new_globals, raw.__name__, raw.__defaults__,
                              raw.__closure__)
    copy.__qualname__, copy.__module__ = raw.__qualname__, raw.__module__
    copy.__annotations__, copy.__kwdefaults__ = raw.__annotations__, raw.__kwdefaults__
    copy.__doc__ = raw.__doc__
    try:
        jit = JITFunction(copy, **dict(getattr(fn, "kwargs", {}) or {}))
    except TypeError:
        jit = JITFunction(copy)
    _JIT_OF[id(fn)] = jit
    return jit


@contextlib.contextmanager
def _interpret_off() -> Iterator[None]:
    """TRITON_INTERPRET off: the front end takes interpreter shortcuts (e.g. in constexpr
    functions) and some modules refuse to import while it is on."""
    saved_env = os.environ.get("TRITON_INTERPRET")
    runtime = None
    with contextlib.suppress(ImportError, AttributeError):
        from triton import knobs

        runtime = knobs.runtime
    saved_knob = runtime.__dict__.get("interpret", _UNSET) if runtime is not None else _UNSET
    os.environ["TRITON_INTERPRET"] = "0"
    if runtime is not None:
        runtime.__dict__["interpret"] = False  # the knob's override slot, without touching env
    try:
        yield
    finally:
        if saved_env is None:
            os.environ.pop("TRITON_INTERPRET", None)
        else:
            os.environ["TRITON_INTERPRET"] = saved_env
        if runtime is not None:
            if saved_knob is _UNSET:
                runtime.__dict__.pop("interpret", None)
            else:
                runtime.__dict__["interpret"] = saved_knob


@contextlib.contextmanager
def compiler_mode() -> Iterator[None]:
    """Within it, triton.language is the pre-launch language with JITFunctions (see module doc)."""
    snapshot_language()
    assert _SNAPSHOT is not None
    with _interpret_off():
        undo = [(ns, _set_namespace(ns, clean)) for ns, clean in _SNAPSHOT]
        try:
            for ns, clean in _SNAPSHOT:
                for name, value in clean.items():
                    if is_interpreted(value):
                        setattr(ns, name, to_jit(value))
            yield
        finally:
            for ns, previous in reversed(undo):
                _set_namespace(ns, previous)
