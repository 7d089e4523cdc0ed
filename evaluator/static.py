"""Static anti-cheat rules, run on the candidate's syntax tree before anything executes.

Names, rationales and severities per policy are in the one rule table (`evaluator.rules`); this
module holds the checks. Rules look at what the code does (imports, calls, assignments, class
bases), never at text, so a `try/except` around `load_inline` or a `pass` in a helper cannot
trip them, and each fires only on what it can show: a Lock starts no thread, a table of launch
configs keyed by alignment stores no output, a cuDNN flags scope with strict's own settings
changes nothing. A static rule can be evaded by code it cannot see (e.g. in a C++ string); the
runtime rules back it up, and each rationale says which one does.
"""

from __future__ import annotations

import ast
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass

from evaluator.backend import _Imports
from evaluator.result import Violation
from evaluator.rules import Rule, Severity, of_kind

__all__ = ["RULES", "Rule", "Severity", "static_violations"]

INTROSPECTION_MODULES = {"inspect", "gc"}
INTROSPECTION_ATTRS = {
    "_getframe", "f_locals", "f_globals", "f_back", "f_builtins", "f_code", "tb_frame",
    "gi_frame", "cr_frame", "get_objects", "get_referrers", "get_referents", "modules",
    "__globals__",
}
INTROSPECTION_CALLS = {"globals", "vars"}
CONCURRENCY_MODULES = {"threading", "_thread", "multiprocessing", "concurrent", "subprocess",
                       "asyncio", "pty", "torch.multiprocessing", "sched"}
# threading names that start nothing: a candidate may guard lazy set-up with them.
SAFE_THREADING = {"Lock", "RLock", "Semaphore", "BoundedSemaphore", "Event", "Condition",
                  "local", "get_ident"}
PROCESS_CALLS = {"fork", "forkpty", "system", "popen", "posix_spawn", "posix_spawnp", "execv",
                 "execve", "execl", "execle", "execlp", "execvp", "execvpe", "spawnv", "spawnl",
                 "spawnve", "spawnle", "spawnlp", "spawnvp"}
PROTECTED_ROOTS = {"torch", "time", "triton", "numpy", "builtins", "sys", "os", "timeit",
                   "functools", "math"}
TENSOR_BASES = {"torch.Tensor", "torch._C.TensorBase", "torch._C._TensorBase"}
MODE_BASES = {"TorchFunctionMode", "TorchDispatchMode"}
SUBCLASS_CALLS = {"_make_subclass", "_make_wrapper_subclass", "as_subclass"}
IDENTITY_KEYS = {"data_ptr", "untyped_storage", "storage", "_cdata", "storage_offset"}
SHAPE_KEYS = {"shape", "size", "stride"}
MAX_ALIGNMENT = 4096
"""`data_ptr() % n` (or `& (n - 1)`) with n up to this is an alignment test, not an identity."""
SCALAR_ATTRS = {"shape", "ndim", "dtype", "device", "is_cuda", "itemsize"}
SCALAR_METHODS = {"size", "stride", "numel", "dim", "element_size", "is_contiguous",
                  "get_device", "data_ptr"}
SCALAR_CALLS = {"int", "bool", "float", "tuple", "min", "max", "abs", "round", "len", "divmod",
                "triton.next_power_of_2", "triton.cdiv", "math.ceil", "math.floor", "math.log2",
                "math.gcd", "math.prod", "math.isqrt"}
FLAG_CALLS = {"torch.set_float32_matmul_precision", "torch.use_deterministic_algorithms",
              "torch.set_default_dtype", "torch.set_default_device", "torch.set_flush_denormal",
              "torch.backends.cudnn.flags", "torch.backends.cudnn.set_flags",
              "torch.backends.mkldnn.flags", "torch.backends.mkldnn.set_flags",
              "torch.backends.cuda.preferred_linalg_library",
              "torch.backends.cuda.preferred_blas_library"}
# `torch.backends.cudnn.flags(...)` keywords that may appear in a scope with strict's settings;
# allow_tf32 must be given as False (the function's default is True).
SCOPED_CUDNN_FLAGS = {"enabled", "benchmark", "benchmark_limit", "deterministic", "allow_tf32"}
COMPILE_CALLS = {"torch.compile", "torch._dynamo.optimize", "torch.cuda.CUDAGraph",
                 "torch.cuda.graph", "torch.cuda.graphs.graph", "torch.cuda.make_graphed_callables",
                 "torch.jit.script", "torch.jit.trace", "torch.export.export"}
DYNAMIC_CALLS = {"exec", "eval", "compile", "__import__", "importlib.import_module",
                 "importlib.__import__", "runpy.run_path", "runpy.run_module"}


@dataclass(frozen=True)
class Finding:
    line: int | None
    message: str


class Context:
    """The parsed candidate with import aliases resolved; what every rule reads."""

    def __init__(self, source: str) -> None:
        self.tree = ast.parse(source)
        self.imports = _Imports()
        self.imports.visit(self.tree)
        self.module_names = {
            t.id for stmt in self.tree.body if isinstance(stmt, (ast.Assign, ast.AnnAssign))
            for t in (stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target])
            if isinstance(t, ast.Name)
        } | {n for node in ast.walk(self.tree) if isinstance(node, ast.Global) for n in node.names}

    def full(self, node: ast.AST) -> str:
        """Dotted name with import aliases expanded (`tc.synchronize` -> `torch.cuda.synchronize`);
        builtins and unknown expressions resolve to themselves or ''."""
        return self.imports.resolve(node) or ""

    def nodes(self, *types: type) -> Iterator[ast.AST]:
        return (n for n in ast.walk(self.tree) if isinstance(n, types))

    def calls(self) -> Iterator[tuple[ast.Call, str]]:
        for call in self.nodes(ast.Call):
            yield call, self.full(call.func)  # type: ignore[attr-defined]


Check = Callable[[Context], list[Finding]]
RULES: dict[str, Rule] = of_kind("static")
"""The static rules of the table in `evaluator.rules` (name, rationale, severities)."""
CHECKS: dict[str, Check] = {}


def rule(name: str) -> Callable[[Check], Check]:
    """Registers the check of the static rule `name` (which must be in the rule table)."""
    def register(check: Check) -> Check:
        if RULES.get(name) is None:
            raise KeyError(f"static rule {name!r} is not in evaluator.rules")
        CHECKS[name] = check
        return check

    return register


def _imported_modules(ctx: Context) -> Iterator[tuple[ast.AST, str]]:
    for node in ctx.nodes(ast.Import, ast.ImportFrom):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node, alias.name
        else:
            base = node.module or ""
            yield node, base
            for alias in node.names:
                yield node, f"{base}.{alias.name}" if base else alias.name


def _matches(name: str, modules: set[str]) -> bool:
    return any(name == m or name.startswith(m + ".") for m in modules)


@rule("frame_introspection")
def _introspection(ctx: Context) -> list[Finding]:
    out = [Finding(n.lineno, f"imports {name}") for n, name in _imported_modules(ctx)
           if _matches(name, INTROSPECTION_MODULES)]
    for node in ctx.nodes(ast.Attribute):
        attr = node.attr  # type: ignore[attr-defined]
        if attr in INTROSPECTION_ATTRS and (attr != "modules" or ctx.full(node) == "sys.modules"):
            out.append(Finding(node.lineno, f"uses .{attr}"))
    for call, name in ctx.calls():
        if name in INTROSPECTION_CALLS and not call.args:
            out.append(Finding(call.lineno, f"calls {name}()"))
    return out


def _tamper_target(ctx: Context, target: ast.AST) -> str | None:
    if not isinstance(target, ast.Attribute):
        return None
    full = ctx.full(target)
    root = full.split(".")[0]
    if root in PROTECTED_ROOTS and not full.startswith("torch.backends."):
        return full
    return None


@rule("timing_or_comparison_tampering")
def _tampering(ctx: Context) -> list[Finding]:
    out = []
    for node in ctx.nodes(ast.Assign, ast.AugAssign, ast.AnnAssign, ast.Delete):
        targets = node.targets if isinstance(node, (ast.Assign, ast.Delete)) else [node.target]
        for t in targets:
            full = _tamper_target(ctx, t)
            if full:
                out.append(Finding(node.lineno, f"assigns {full}"))
    for call, name in ctx.calls():
        if name in ("setattr", "delattr") and call.args:
            full = ctx.full(call.args[0])
            if full.split(".")[0] in PROTECTED_ROOTS and not full.startswith("torch.backends"):
                out.append(Finding(call.lineno, f"{name}() on {full}"))
    out += [Finding(n.lineno, f"imports {name}") for n, name in _imported_modules(ctx)
            if _matches(name, {"unittest.mock"})]
    for node in ctx.nodes(ast.Attribute):
        owner = ctx.full(node.value)  # type: ignore[attr-defined]
        if node.attr == "__dict__" and owner.split(".")[0] in PROTECTED_ROOTS:  # type: ignore[attr-defined]
            out.append(Finding(node.lineno, f"reaches into {owner}.__dict__"))
    out += [Finding(n.lineno, "uses __builtins__") for n in ctx.nodes(ast.Name)
            if n.id == "__builtins__"]  # type: ignore[attr-defined]
    return out


def _parents(ctx: Context) -> dict[ast.AST, ast.AST]:
    return {child: node for node in ast.walk(ctx.tree) for child in ast.iter_child_nodes(node)}


def _threading_uses(ctx: Context) -> Iterator[Finding]:
    """Uses of `threading` other than its synchronisation primitives: the module passed around
    as a value, a name outside SAFE_THREADING, or anything reached through a safe name
    (`threading.Lock.__self__` is the `_thread` module, which starts threads)."""
    parents = _parents(ctx)
    for node in ctx.nodes(ast.Name, ast.Attribute):
        full = ctx.full(node)
        parts = full.split(".")
        if parts[0] != "threading" or len(parts) > 2:
            continue
        parent = parents.get(node)
        reached_through = isinstance(parent, ast.Attribute) and parent.value is node
        if len(parts) == 1 and not reached_through:
            yield Finding(node.lineno, "uses the threading module as a value")  # type: ignore[attr-defined]
        elif len(parts) == 2 and (parts[1] not in SAFE_THREADING or reached_through):
            what = full if parts[1] not in SAFE_THREADING else f"{full}.{parent.attr}"  # type: ignore[union-attr]
            yield Finding(node.lineno, f"uses {what}")  # type: ignore[attr-defined]


@rule("threads_or_processes")
def _concurrency(ctx: Context) -> list[Finding]:
    out = []
    for node in ctx.nodes(ast.Import, ast.ImportFrom):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names if a.name != "threading"]
        elif node.module == "threading":
            names = [f"threading.{a.name}" for a in node.names if a.name not in SAFE_THREADING]
        else:
            names = [node.module or ""]
        out += [Finding(node.lineno, f"imports {n}") for n in names
                if _matches(n, CONCURRENCY_MODULES)]
    out += _threading_uses(ctx)
    for call, name in ctx.calls():
        if name.startswith("os.") and name.split(".", 1)[1] in PROCESS_CALLS:
            out.append(Finding(call.lineno, f"calls {name}"))
    return out


@rule("tensor_subclass")
def _tensor_subclass(ctx: Context) -> list[Finding]:
    out = []
    for cls in ctx.nodes(ast.ClassDef):
        for base in cls.bases:  # type: ignore[attr-defined]
            full = ctx.full(base)
            if full in TENSOR_BASES or full.split(".")[-1] in MODE_BASES:
                out.append(Finding(cls.lineno, f"class {cls.name} subclasses {full}"))  # type: ignore[attr-defined]
        for item in cls.body:  # type: ignore[attr-defined]
            if isinstance(item, ast.FunctionDef) and item.name in (
                "__torch_function__", "__torch_dispatch__"
            ):
                out.append(Finding(item.lineno, f"defines {item.name}"))
    for call, name in ctx.calls():
        if name.split(".")[-1] in SUBCLASS_CALLS:
            out.append(Finding(call.lineno, f"calls {name.split('.')[-1]}"))
    return out


@rule("reference_model")
def _reference_model(ctx: Context) -> list[Finding]:
    out = []
    for cls in ctx.nodes(ast.ClassDef):
        for base in cls.bases:  # type: ignore[attr-defined]
            if ctx.full(base).split(".")[-1] == "Model":
                out.append(Finding(cls.lineno, f"class {cls.name} subclasses Model"))  # type: ignore[attr-defined]
    for call, name in ctx.calls():
        if name.split(".")[-1] == "Model" or (name == "super" and call.args
                                               and ctx.full(call.args[0]) == "Model"):
            out.append(Finding(call.lineno, "calls the reference Model"))
    out += [Finding(n.lineno, f"imports {name}") for n, name in _imported_modules(ctx)
            if name.split(".")[0] in ("problems", "kernelbench", "evaluator")]
    return out


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
                elif isinstance(t, (ast.Tuple, ast.List)):
                    for e in ast.walk(t):
                        if isinstance(e, ast.Name):
                            out.setdefault(e.id, []).append(ast.Constant(value=...))
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
    if isinstance(node, ast.Attribute):
        return node.attr in SCALAR_ATTRS
    if isinstance(node, ast.Subscript):
        return rec(node.value) and rec(node.slice)
    if isinstance(node, ast.Call):
        f = node.func
        known = ctx.full(f) in SCALAR_CALLS or (
            isinstance(f, ast.Attribute) and f.attr in SCALAR_METHODS)
        return known and all(rec(a) for a in [*node.args, *(k.value for k in node.keywords)])
    return False


def _walk_scope(scope: ast.AST) -> Iterator[ast.AST]:
    """The nodes of one scope, without descending into the functions defined in it."""
    yield scope
    for child in ast.iter_child_nodes(scope):
        if not isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            yield from _walk_scope(child)


def _written_containers(ctx: Context) -> set[str]:
    """Source text of every container something other than a provable scalar is stored into
    (`c[k] = v`, `c.setdefault(k, v)`, `c.update(...)`): a table that is only ever read is a
    constant, and one that only stores launch configs cannot return an output."""
    out = set()
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


def _cache_lookups(ctx: Context) -> Iterator[tuple[int, str]]:
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


@rule("identity_keyed_cache")
def _identity_cache(ctx: Context) -> list[Finding]:
    return [Finding(line, "keys a persistent cache by tensor identity/pointer")
            for line, kind in _cache_lookups(ctx) if kind == "identity"]


@rule("shape_keyed_cache")
def _shape_cache(ctx: Context) -> list[Finding]:
    out = [Finding(line, "keys a persistent cache by tensor shape")
           for line, kind in _cache_lookups(ctx) if kind == "shape"]
    for fn in ctx.nodes(ast.FunctionDef, ast.AsyncFunctionDef):
        for dec in fn.decorator_list:  # type: ignore[attr-defined]
            name = ctx.full(dec.func if isinstance(dec, ast.Call) else dec)
            if name.split(".")[-1] in ("lru_cache", "cache"):
                out.append(Finding(fn.lineno, f"memoises {fn.name} with {name}"))  # type: ignore[attr-defined]
    return out


def _strict_cudnn_scope(call: ast.Call) -> bool:
    """`torch.backends.cudnn.flags(...)` with literal keywords equal to strict's settings: TF32
    off (given explicitly: the function defaults it to on) and no benchmark autotuning. It is
    restored on exit and changes nothing strict has not already set."""
    if call.args or any(k.arg not in SCOPED_CUDNN_FLAGS for k in call.keywords):
        return False
    values = {k.arg: k.value for k in call.keywords}
    if not all(isinstance(v, ast.Constant) for v in values.values()):
        return False
    tf32, bench = values.get("allow_tf32"), values.get("benchmark")
    return tf32 is not None and tf32.value is False and \
        (bench is None or bench.value is False)  # type: ignore[attr-defined]


@rule("global_backend_flags")
def _backend_flags(ctx: Context) -> list[Finding]:
    out = []
    for node in ctx.nodes(ast.Assign, ast.AugAssign, ast.AnnAssign):
        targets = node.targets if isinstance(node, ast.Assign) else [node.target]
        for t in targets:
            if isinstance(t, ast.Attribute) and ctx.full(t).startswith("torch.backends."):
                out.append(Finding(node.lineno, f"sets {ctx.full(t)}"))
    for call, name in ctx.calls():
        if name in FLAG_CALLS and not (name == "torch.backends.cudnn.flags"
                                       and _strict_cudnn_scope(call)):
            out.append(Finding(call.lineno, f"calls {name}"))
        elif name in ("setattr", "delattr") and call.args and \
                ctx.full(call.args[0]).startswith("torch.backends"):
            out.append(Finding(call.lineno, f"{name}() on {ctx.full(call.args[0])}"))
    return out


@rule("torch_compile_or_cuda_graph")
def _compile_graphs(ctx: Context) -> list[Finding]:
    out = [Finding(call.lineno, f"calls {name}") for call, name in ctx.calls()
           if name in COMPILE_CALLS]
    for fn in ctx.nodes(ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef):
        for dec in fn.decorator_list:  # type: ignore[attr-defined]
            name = ctx.full(dec.func if isinstance(dec, ast.Call) else dec)
            if name in COMPILE_CALLS:
                out.append(Finding(fn.lineno, f"decorates {fn.name} with {name}"))  # type: ignore[attr-defined]
    return out


@rule("dynamic_code")
def _dynamic_code(ctx: Context) -> list[Finding]:
    return [Finding(call.lineno, f"calls {name}") for call, name in ctx.calls()
            if name in DYNAMIC_CALLS]


def static_violations(
    source: str, policy: str = "strict", *, severities: Mapping[str, Severity] | None = None
) -> list[Violation]:
    """Every rule's findings as Violations (one per rule and line), with the policy's severity;
    `severities` overrides it per rule name. Raises SyntaxError on unparsable source."""
    ctx = Context(source)
    out: list[Violation] = []
    for r in RULES.values():
        severity = (severities or {}).get(r.name, r.severity(policy))
        seen: set[int | None] = set()
        for f in CHECKS[r.name](ctx):
            if f.line not in seen:
                seen.add(f.line)
                out.append(Violation(rule=r.name, severity=severity, line=f.line,
                                     message=f"{f.message}: {r.rationale}"))
    return sorted(out, key=lambda v: (v.line or 0, v.rule))
