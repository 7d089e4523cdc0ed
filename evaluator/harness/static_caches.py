"""Which persistent tables a candidate keys by tensor identity or shape, and whether what it
stores in them could be an output: the analysis behind the `identity_keyed_cache` and
`shape_keyed_cache` rules of `evaluator.harness.static`.

A table is a cache only if something that is not provably a Python scalar is stored in it: a
launch-config table keyed by `(shape, data_ptr() % 16 == 0)` that stores block sizes cannot
return an output. "Provably scalar" is judged from constants, tensor metadata (shape, sizes,
strides, alignment) and the few builtins that keep scalars scalar, following assignments in the
same function and a helper's parameters to its call sites. What this cannot see (an int that
indexes a list of kept outputs, C4d) is left to the runtime checks on fresh inputs, which is
why both rules only flag.
"""

from __future__ import annotations

import ast
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from kloop.evaluator.harness.static import Context

IDENTITY_KEYS = {"data_ptr", "untyped_storage", "storage", "_cdata", "storage_offset"}
SHAPE_KEYS = {"shape", "size", "stride"}
MAX_ALIGNMENT = 4096
"""`data_ptr() % n` (or `& (n - 1)`) with n up to this is an alignment test, not an identity."""
SCALAR_ATTRS = {"shape", "ndim", "dtype", "device", "is_cuda", "itemsize"}
DEVICE_PROPS = {"multi_processor_count", "L2_cache_size", "total_memory", "major", "minor",
                "warp_size", "max_threads_per_multi_processor", "regs_per_multiprocessor",
                "shared_memory_per_block", "shared_memory_per_block_optin",
                "shared_memory_per_multiprocessor"}
"""Read from `torch.cuda.get_device_properties(...)` (directly or through a name assigned
only from it): what launch configs are sized by."""
RECORD_FIELD_TYPES = {"int", "float", "bool", "str"}
SCALAR_METHODS = {"size", "stride", "numel", "dim", "element_size", "is_contiguous",
                  "get_device", "data_ptr"}
SCALAR_CALLS = {"int", "bool", "float", "tuple", "min", "max", "abs", "round", "len", "divmod",
                "triton.next_power_of_2", "triton.cdiv", "math.ceil", "math.floor", "math.log2",
                "math.gcd", "math.prod", "math.isqrt"}

def _persistent(ctx: Context, node: ast.AST) -> bool:
    """A container that outlives one call: a module global, or an attribute of self/cls."""
    if isinstance(node, ast.Name):
        return node.id in ctx.module_names
    return isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and \
        node.value.id in ("self", "cls")


def _alignment(ctx: Context, node: ast.AST) -> bool:
    """`p % 16`, `p & 15`: a pointer reduced to a few bits (alignment), not an identity."""
    return isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Mod, ast.BitAnd)) and \
        isinstance(node.right, ast.Constant) and isinstance(node.right.value, int) and \
        0 < node.right.value <= MAX_ALIGNMENT


def _walk_skipping(ctx: Context, node: ast.AST) -> Iterator[ast.AST]:
    """ast.walk without the subtrees that reduce a pointer to its alignment."""
    yield node
    for child in ast.iter_child_nodes(node):
        if not _alignment(ctx, child):
            yield from _walk_skipping(ctx, child)


def _key_kind(ctx: Context, key: ast.AST, local: Mapping[str, list[ast.AST]]) -> str | None:
    """`identity` when a cache key is built from id()/data_ptr()/storage, `shape` when from
    shapes/sizes or a pointer's alignment, following local assignments
    (`k = (x.data_ptr(), x.shape)`)."""
    keys = local.get(key.id, [key]) if isinstance(key, ast.Name) else [key]
    # One level further: the names a key is built from (`(M, N)` after `M, N = x.shape`).
    keys = keys + [v for k in keys for n in ast.walk(k) if isinstance(n, ast.Name)
                   for v in local.get(n.id, []) if v is not k]
    kinds = set()
    for k in keys:
        for n in _walk_skipping(ctx, k):
            if isinstance(n, ast.Call) and ctx.full(n.func) in ("id", "hash"):
                kinds.add("identity")
            elif isinstance(n, ast.Attribute) and n.attr in IDENTITY_KEYS:
                kinds.add("identity")
            elif isinstance(n, ast.Attribute) and n.attr in SHAPE_KEYS:
                kinds.add("shape")
        kinds |= {"shape" for n in ast.walk(k) if _alignment(ctx, n)}
    return "identity" if "identity" in kinds else "shape" if kinds else None


def _assignments(scope: ast.AST) -> dict[str, list[ast.AST]]:
    """Every value assigned to each plain name in `scope` (an unpacking target maps to None)."""
    out: dict[str, list[ast.AST]] = {}
    for n in ast.walk(scope):
        if isinstance(n, (ast.Assign, ast.AnnAssign, ast.AugAssign, ast.NamedExpr)):
            targets = n.targets if isinstance(n, ast.Assign) else [n.target]
            for t in targets:
                if isinstance(t, ast.Name) and n.value is not None:
                    out.setdefault(t.id, []).append(n.value)
                elif isinstance(t, (ast.Tuple, ast.List)) and _shape_unpacking(t, n.value):
                    for i, e in enumerate(t.elts):  # `M, K = x.shape`: M is x.shape[0]
                        out.setdefault(e.id, []).append(  # type: ignore[attr-defined]
                            ast.Subscript(value=n.value, slice=ast.Constant(value=i)))
                elif isinstance(t, (ast.Tuple, ast.List)):
                    for e in ast.walk(t):
                        if isinstance(e, ast.Name):
                            out.setdefault(e.id, []).append(ast.Constant(value=...))
        elif isinstance(n, ast.Match):
            for case in n.cases:
                _bind_pattern(case.pattern, n.subject, out)
        elif isinstance(n, (ast.For, ast.comprehension, ast.With, ast.arguments)):
            bound = [n.target] if isinstance(n, (ast.For, ast.comprehension)) else \
                [i.optional_vars for i in n.items if i.optional_vars] if isinstance(n, ast.With) \
                else [*n.posonlyargs, *n.args, *n.kwonlyargs]
            for b in bound:
                for e in ast.walk(b):
                    name = e.arg if isinstance(e, ast.arg) else getattr(e, "id", None)
                    scalar = isinstance(e, ast.arg) and isinstance(e.annotation, ast.Name) \
                        and e.annotation.id in ("int", "bool", "float")
                    if name:
                        out.setdefault(name, []).append(ast.Constant(value=0 if scalar else ...))
    return out


def _bind_pattern(pattern: ast.AST, subject: ast.AST, out: dict[str, list[ast.AST]]) -> None:
    """Names a `case` pattern captures: `case (m, n)` binds m to `subject[0]`, `case x` to the
    subject itself; what cannot be placed (after a `*rest`, in mappings and class patterns)
    is unknown."""
    if isinstance(pattern, ast.MatchAs):
        if pattern.name:
            out.setdefault(pattern.name, []).append(subject)
        if pattern.pattern is not None:
            _bind_pattern(pattern.pattern, subject, out)
    elif isinstance(pattern, ast.MatchOr):
        for p in pattern.patterns:
            _bind_pattern(p, subject, out)
    elif isinstance(pattern, ast.MatchSequence) and not any(
            isinstance(p, ast.MatchStar) for p in pattern.patterns):
        for i, p in enumerate(pattern.patterns):
            _bind_pattern(p, ast.Subscript(value=subject, slice=ast.Constant(value=i)), out)
    else:
        for n in ast.walk(pattern):
            name = n.name if isinstance(n, (ast.MatchAs, ast.MatchStar)) else \
                n.rest if isinstance(n, ast.MatchMapping) else None
            if name:
                out.setdefault(name, []).append(ast.Constant(value=...))


def _shape_unpacking(target: ast.Tuple | ast.List, value: ast.AST | None) -> bool:
    """`a, b = x.shape` or `= x.size()`: plain names unpacked from a shape."""
    if not all(isinstance(e, ast.Name) for e in target.elts):
        return False
    if isinstance(value, ast.Attribute):
        return value.attr == "shape"
    return isinstance(value, ast.Call) and isinstance(value.func, ast.Attribute) and \
        value.func.attr == "size" and not value.args and not value.keywords


def _reads(node: ast.AST, container: str) -> bool:
    """`container[k]`, `container.get(k)`: what it yields is what was stored in it."""
    if isinstance(node, ast.Subscript):
        return ast.unparse(node.value) == container
    return isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and \
        node.func.attr in ("get", "setdefault") and ast.unparse(node.func.value) == container


@dataclass(frozen=True)
class _Scoped:
    """An argument at a call site, to be judged with the caller's names."""

    expr: ast.AST
    names: Mapping[str, list[ast.AST]]


def _parameter_values(ctx: Context, fn: ast.FunctionDef | ast.AsyncFunctionDef,
                      names: dict[str, list[ast.AST]], caller_names: Callable) -> None:
    """Replace the unknown value of each of `fn`'s parameters by the arguments passed at its
    call sites in this module (`f(a)`, `self.f(a)`): a config helper called with shapes
    computes from shapes. A parameter without a call site for it stays unknown."""
    params = [a.arg for a in [*fn.args.posonlyargs, *fn.args.args]]
    offset = 1 if params[:1] in (["self"], ["cls"]) else 0
    sites: dict[str, list[ast.AST]] = {}
    for caller, call in caller_names():
        f = call.func
        called = f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) \
            else None
        if called != fn.name:
            continue
        is_method = isinstance(f, ast.Attribute)
        for i, arg in enumerate(call.args):
            index = i + (offset if is_method else 0)
            if index < len(params) and not isinstance(arg, ast.Starred):
                sites.setdefault(params[index], []).append(_Scoped(arg, caller))
        for k in call.keywords:
            if k.arg in params:
                sites.setdefault(k.arg, []).append(_Scoped(k.value, caller))
    for p in params[offset:]:
        unknown = [v for v in names.get(p, []) if isinstance(v, ast.Constant) and v.value is ...]
        if p in sites and unknown:
            names[p] = [v for v in names[p] if v not in unknown] + sites[p]  # type: ignore[operator]


def _scalar(ctx: Context, node: ast.AST, names: Mapping[str, list[ast.AST]], container: str,
            deciding: frozenset[str] = frozenset()) -> bool:
    """Provably a Python scalar (or a tuple of them) computed from constants and tensor
    metadata, never from tensor values: what a launch-config table stores. Values read back
    from `container` itself count as what was stored there; a name is scalar when every value
    assigned to it is (a name being decided counts as scalar, so `n = n * 2` terminates)."""
    if isinstance(node, _Scoped):
        return _scalar(ctx, node.expr, node.names, container, frozenset())
    if isinstance(node, ast.Name):
        if node.id in deciding:
            return True
        deciding = deciding | {node.id}

    def rec(n: ast.AST) -> bool:
        return _scalar(ctx, n, names, container, deciding)

    if _reads(node, container):
        return True
    if isinstance(node, ast.Constant):
        return node.value is not ...
    if isinstance(node, (ast.Tuple, ast.List)):
        return all(rec(e) for e in node.elts)
    if isinstance(node, (ast.BinOp, ast.UnaryOp, ast.BoolOp, ast.Compare, ast.IfExp)):
        return all(rec(c) for c in ast.iter_child_nodes(node)
                   if not isinstance(c, (ast.operator, ast.unaryop, ast.boolop, ast.cmpop)))
    if isinstance(node, ast.Name):
        values = names.get(node.id)
        return bool(values) and all(rec(v) for v in values)
    if isinstance(node, ast.Attribute) and node.attr in DEVICE_PROPS:
        base = node.value
        bases = names.get(base.id, []) if isinstance(base, ast.Name) else [base]
        return bool(bases) and all(isinstance(b, ast.Call) and ctx.full(b.func)
                                   == "torch.cuda.get_device_properties" for b in bases)
    if isinstance(node, ast.Attribute):
        return node.attr in SCALAR_ATTRS or (node.attr == "index" and isinstance(
            node.value, ast.Attribute) and node.value.attr == "device")  # x.device.index
    if isinstance(node, ast.Subscript):
        return rec(node.value) and rec(node.slice)
    if isinstance(node, ast.Call):
        f = node.func
        known = ctx.full(f) in SCALAR_CALLS or (
            isinstance(f, ast.Attribute) and f.attr in SCALAR_METHODS) or _record(ctx, f)
        return known and all(rec(a) for a in [*node.args, *(k.value for k in node.keywords)])
    return False


def _record(ctx: Context, func: ast.AST) -> bool:
    """A class of this module whose instances hold scalars only: a frozen dataclass or a
    NamedTuple, every field annotated int/float/bool/str, nothing else assigned in its body
    (methods may compute, but hold nothing). Built from scalars, it is a launch config."""
    if not isinstance(func, ast.Name):
        return False
    cls = next((n for n in ctx.tree.body if isinstance(n, ast.ClassDef) and n.name == func.id),
               None)
    if cls is None or sum(isinstance(n, ast.ClassDef) and n.name == func.id
                          for n in ast.walk(ctx.tree)) != 1 or func.id in _assignments(ctx.tree):
        return False  # another class of that name, or the name bound to something else
    frozen = any(ctx.full(d.func).split(".")[-1] == "dataclass" and any(
        k.arg == "frozen" and isinstance(k.value, ast.Constant) and k.value.value is True
        for k in d.keywords) for d in cls.decorator_list if isinstance(d, ast.Call))
    named = not cls.decorator_list and [ctx.full(b) for b in cls.bases] in (
        ["NamedTuple"], ["typing.NamedTuple"])
    if not (frozen or named) or cls.keywords:
        return False
    for stmt in cls.body:
        if isinstance(stmt, ast.AnnAssign):
            if not (isinstance(stmt.target, ast.Name) and isinstance(stmt.annotation, ast.Name)
                    and stmt.annotation.id in RECORD_FIELD_TYPES
                    and (stmt.value is None or isinstance(stmt.value, ast.Constant))):
                return False
        elif not isinstance(stmt, (ast.FunctionDef, ast.Expr, ast.Pass)):
            return False  # class attributes, nested classes, __slots__ tricks
    return True


def _walk_scope(scope: ast.AST) -> Iterator[ast.AST]:
    """The nodes of one scope, without descending into the functions defined in it."""
    yield scope
    for child in ast.iter_child_nodes(scope):
        if not isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            yield from _walk_scope(child)


def _scopes(ctx: Context):
    """(module names, functions, each function's names, a generator of every call site with
    the names of its scope): what `_parameter_values` reads."""
    module_names = _assignments(ctx.tree)
    functions = list(ctx.nodes(ast.FunctionDef, ast.AsyncFunctionDef))
    scope_names = {fn: {**module_names, **_assignments(fn)} for fn in functions}

    def call_sites() -> Iterator[tuple[Mapping[str, list[ast.AST]], ast.Call]]:
        for fn in functions:
            for call in ast.walk(fn):
                if isinstance(call, ast.Call):
                    yield scope_names[fn], call
        for stmt in ctx.tree.body:
            if not isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                for call in ast.walk(stmt):
                    if isinstance(call, ast.Call):
                        yield module_names, call

    return module_names, functions, scope_names, call_sites


def memoises_scalars_only(ctx: Context, fn: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
    """A memoised (`lru_cache`) function that can return only scalars computed from the scalars
    its callers pass: a launch-config helper, which cannot hand back an output. Judged with
    its parameters' values taken from its call sites only (annotations are not believed: a
    tensor passes as an `int`), and only when it is used nowhere but in direct calls (a
    reference passed on could be called with anything). What a call-site argument cannot be
    proved scalar for keeps the flag."""
    a = fn.args
    if a.vararg or a.kwarg or a.kwonlyargs:
        return False
    returns = [n for n in _walk_scope(fn) if isinstance(n, ast.Return)]
    if not returns or any(r.value is None for r in returns) or not _only_called(ctx, fn.name):
        return False
    _, functions, scope_names, call_sites = _scopes(ctx)
    for other in functions:
        if other is not fn:
            _parameter_values(ctx, other, scope_names[other], call_sites)  # type: ignore[arg-type]
    names = scope_names[fn]
    for p in [*a.posonlyargs, *a.args]:
        names[p.arg] = [ast.Constant(value=...)]
    _parameter_values(ctx, fn, names, call_sites)  # type: ignore[arg-type]
    return all(_scalar(ctx, r.value, names, "") for r in returns)  # type: ignore[arg-type]


def _only_called(ctx: Context, name: str) -> bool:
    """Every use of `name` (as a name or an attribute) is the function of a call."""
    callees = {id(n.func) for n in ast.walk(ctx.tree) if isinstance(n, ast.Call)}
    for n in ast.walk(ctx.tree):
        used = (isinstance(n, ast.Name) and n.id == name and isinstance(n.ctx, ast.Load)) or \
            (isinstance(n, ast.Attribute) and n.attr == name)
        if used and id(n) not in callees:
            return False
    return True


def _written_containers(ctx: Context) -> set[str]:
    """Source text of every container something other than a provable scalar is stored into
    (`c[k] = v`, `c.setdefault(k, v)`, `c.update(...)`): a table that is only ever read is a
    constant, and one that only stores launch configs cannot return an output."""
    out = set()
    module_names, functions, scope_names, call_sites = _scopes(ctx)
    for fn in functions:
        _parameter_values(ctx, fn, scope_names[fn], call_sites)  # type: ignore[arg-type]
    for scope in [*functions, ctx.tree]:
        names = scope_names.get(scope, module_names)  # type: ignore[call-overload]
        for n in _walk_scope(scope):
            stored: list[tuple[ast.AST, ast.AST | None]] = []
            if isinstance(n, (ast.Assign, ast.AugAssign, ast.AnnAssign)):
                targets = n.targets if isinstance(n, ast.Assign) else [n.target]
                stored += [(t.value, n.value) for t in targets if isinstance(t, ast.Subscript)]
            elif isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute):
                if n.func.attr in ("setdefault", "__setitem__"):
                    stored.append((n.func.value, n.args[1] if len(n.args) > 1 else None))
                elif n.func.attr == "update":
                    stored.append((n.func.value, None))
            for container, value in stored:
                if value is None or not _scalar(ctx, value, names, ast.unparse(container)):
                    out.add(ast.unparse(container))
    return out


def cache_lookups(ctx: Context) -> Iterator[tuple[int, str]]:
    """(line, key kind) of every keyed access to a persistent container that is written to."""
    written = _written_containers(ctx)
    for fn in ctx.nodes(ast.FunctionDef, ast.AsyncFunctionDef):
        local = _assignments(fn)
        for n in ast.walk(fn):
            pairs: list[tuple[ast.AST, ast.AST]] = []
            if isinstance(n, ast.Subscript):
                pairs.append((n.value, n.slice))
            elif isinstance(n, ast.Compare) and any(isinstance(o, (ast.In, ast.NotIn))
                                                    for o in n.ops):
                pairs += [(c, n.left) for c in n.comparators]
            elif isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.args and \
                    n.func.attr in ("get", "setdefault", "pop", "__contains__", "__getitem__"):
                pairs.append((n.func.value, n.args[0]))
            for container, key in pairs:
                cache = _persistent(ctx, container) and ast.unparse(container) in written
                kind = _key_kind(ctx, key, local) if cache else None
                if kind:
                    yield n.lineno, kind
