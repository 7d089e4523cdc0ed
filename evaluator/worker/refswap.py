"""Every reference to some objects, replaced for the length of a block (the ghost trial's stubs).

A candidate can keep its extension functions anywhere: in its module or on its modules, but as
well in a list, a tuple, a closure, a `functools.partial`, a default argument or a class
attribute (plain, `staticmethod` or `classmethod`). Swapping only the dicts the harness knew of
left the others calling the real kernel in the ghost trial, which then concluded nothing, so a
decorative CUDA kernel held in a list was never convicted. Here the garbage collector names
every container that refers to a target, and each kind is rewritten in place; a tuple
(immutable) is rebuilt and swapped wherever it is held, to a few levels. References the
collector cannot see (held by native code, or locals of a running frame) stay: the profiler's
count of launches that got past the stubs covers those, and the trial then concludes nothing
rather than convicting.
"""

from __future__ import annotations

import functools
import gc
import types
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

TUPLE_DEPTH = 3
"""How many tuples deep a reference is followed (a tuple in a tuple in an instance dict)."""


@contextmanager
def swapped(pairs: list[tuple[Any, Any]]) -> Iterator[int]:
    """Within the block, every reference the collector sees to each `original` of `pairs`
    (original, replacement) refers to its replacement instead; all are put back on exit.
    Yields how many references were replaced."""
    undo: list[functools.partial] = []
    try:
        _swap(pairs, undo, 0)
        yield len(undo)
    finally:
        for step in reversed(undo):
            step()


def _swap(pairs: list[tuple[Any, Any]], undo: list[functools.partial], depth: int) -> None:
    if not pairs:
        return
    originals = [o for o, _ in pairs]
    by_id = {id(o): r for o, r in pairs}
    ours = {id(originals), id(pairs), *(id(p) for p in pairs), id(undo)}
    for step in undo:  # earlier swaps' records refer to what they replaced (a tuple, its state)
        ours.update((id(step), id(step.args), *(id(a) for a in step.args)))
    for _, replacement in pairs:  # a replacement that wraps its original must keep calling it
        ours.update(id(c) for c in getattr(replacement, "__closure__", None) or ())
    for holder in gc.get_referrers(*originals):
        if id(holder) in ours or isinstance(holder, types.FrameType):
            continue
        try:
            _rewrite(holder, by_id, undo, depth)
        except Exception:  # an object that will not be rewritten (its own attribute hooks)
            continue  # keeps its reference: the profiler's count of bypasses covers it


def _rewrite(holder: Any, by_id: dict[int, Any], undo: list[functools.partial],
             depth: int) -> None:
    if isinstance(holder, dict):
        _rewrite_dict(holder, by_id, undo)
    elif isinstance(holder, list):
        for i, value in enumerate(holder):
            if id(value) in by_id:
                holder[i] = by_id[id(value)]
                undo.append(functools.partial(holder.__setitem__, i, value))
    elif isinstance(holder, types.CellType):
        value = holder.cell_contents
        if id(value) in by_id:
            holder.cell_contents = by_id[id(value)]
            undo.append(functools.partial(setattr, holder, "cell_contents", value))
    elif isinstance(holder, staticmethod | classmethod):
        value = holder.__func__
        if id(value) in by_id:
            holder.__init__(by_id[id(value)])  # re-initialising sets the wrapped callable
            undo.append(functools.partial(holder.__init__, value))
    elif isinstance(holder, functools.partial):
        state = holder.__reduce__()[2]  # (func, args, keywords, dict)
        func, args = state[0], state[1]
        if id(func) in by_id or id(args) in by_id:  # the args tuple: rebuilt one level down
            holder.__setstate__((by_id.get(id(func), func), by_id.get(id(args), args),
                                 *state[2:]))
            undo.append(functools.partial(holder.__setstate__, state))
    elif isinstance(holder, types.FunctionType):
        value = holder.__defaults__
        if value is not None and id(value) in by_id:
            holder.__defaults__ = by_id[id(value)]
            undo.append(functools.partial(setattr, holder, "__defaults__", value))
    elif isinstance(holder, tuple):
        if depth < TUPLE_DEPTH and any(id(v) in by_id for v in holder):
            rebuilt = tuple(by_id.get(id(v), v) for v in holder)
            _swap([(holder, rebuilt)], undo, depth + 1)
    else:
        _rewrite_attributes(holder, by_id, undo)


def _rewrite_dict(d: dict, by_id: dict[int, Any], undo: list[functools.partial]) -> None:
    hits = [(k, v) for k, v in d.items() if id(v) in by_id]
    if not hits:
        return
    owner = _class_owning(d)
    for key, value in hits:
        if owner is not None:  # through setattr: a class's dict must not be written directly
            setattr(owner, key, by_id[id(value)])
            undo.append(functools.partial(setattr, owner, key, value))
        else:
            d[key] = by_id[id(value)]
            undo.append(functools.partial(d.__setitem__, key, value))


def _rewrite_attributes(obj: Any, by_id: dict[int, Any], undo: list[functools.partial]) -> None:
    """An object that holds a target itself: its attributes kept inline (CPython 3.11+ keeps an
    instance's attributes without a dict object until one is asked for) or in `__slots__`."""
    d = getattr(obj, "__dict__", None) if not isinstance(obj, type) else None
    if isinstance(d, dict):
        _rewrite_dict(d, by_id, undo)
    for cls in type(obj).__mro__:
        slots = cls.__dict__.get("__slots__", ())
        for name in [slots] if isinstance(slots, str) else slots:
            value = getattr(obj, name, None)
            if id(value) in by_id:
                setattr(obj, name, by_id[id(value)])
                undo.append(functools.partial(setattr, obj, name, value))


def _class_owning(d: dict) -> type | None:
    """The class whose namespace `d` is, if it is one (its mappingproxy wraps `d`)."""
    for r in gc.get_referrers(d):
        if isinstance(r, type) and any(x is d for x in gc.get_referents(r.__dict__)):
            return r
    return None
