"""Static anti-cheat rules, run on the candidate's syntax tree before anything executes.

Names, rationales and severities per policy are in the one rule table (`evaluator.common.rules`); this
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

from kloop.evaluator.common.backend import _Imports
from kloop.evaluator.common.result import Violation
from kloop.evaluator.common.rules import Rule, Severity, of_kind
from kloop.evaluator.harness.static_caches import cache_lookups, memoises_scalars_only

__all__ = ["RULES", "Rule", "Severity", "static_violations"]

INTROSPECTION_MODULES = {"inspect", "gc"}
# gc names that read no object: a candidate may collect after packing its weights.
SAFE_GC = {"collect", "enable", "disable", "isenabled", "get_count", "get_threshold",
           "set_threshold", "freeze", "unfreeze", "get_freeze_count"}
# What may be done with the candidate's own namespace (`globals()`, `vars()`): look a name up,
# store one, test for one. It holds what the candidate defined and its module's dunders; a
# literal dunder key (`__builtins__`) still counts as introspection.
NAMESPACE_METHODS = {"get", "setdefault", "keys", "items", "values", "update", "pop"}
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
FLAG_CALLS = {"torch.set_float32_matmul_precision", "torch.use_deterministic_algorithms",
              "torch.set_default_dtype", "torch.set_default_device", "torch.set_flush_denormal",
              "torch.backends.cudnn.flags", "torch.backends.cudnn.set_flags",
              "torch.backends.mkldnn.flags", "torch.backends.mkldnn.set_flags",
              "torch.backends.cuda.preferred_linalg_library",
              "torch.backends.cuda.preferred_blas_library"}
# `torch.backends.cudnn.flags(...)` keywords that may appear in a scope with strict's settings;
# allow_tf32 must be given as False (the function's default is True).
SCOPED_CUDNN_FLAGS = {"enabled", "benchmark", "benchmark_limit", "deterministic", "allow_tf32"}
# Flags a candidate may set to the literal False: strict's own settings (TF32 off).
STRICT_FALSE_FLAGS = {"torch.backends.cuda.matmul.allow_tf32", "torch.backends.cudnn.allow_tf32"}
COMPILE_CALLS = {"torch.compile", "torch._dynamo.optimize", "torch.cuda.CUDAGraph",
                 "torch.cuda.graph", "torch.cuda.graphs.graph", "torch.cuda.make_graphed_callables",
                 "torch.jit.script", "torch.jit.trace", "torch.export.export"}
DYNAMIC_CALLS = {"exec", "eval", "compile", "__import__", "importlib.import_module",
                 "importlib.__import__", "runpy.run_path", "runpy.run_module",
                 "pickle.loads", "pickle.load", "marshal.loads", "marshal.load"}


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
"""The static rules of the table in `evaluator.common.rules` (name, rationale, severities)."""
CHECKS: dict[str, Check] = {}


def rule(name: str) -> Callable[[Check], Check]:
    """Registers the check of the static rule `name` (which must be in the rule table)."""
    def register(check: Check) -> Check:
        if RULES.get(name) is None:
            raise KeyError(f"static rule {name!r} is not in evaluator.common.rules")
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


def _gc_uses(ctx: Context, parents: dict[ast.AST, ast.AST]) -> Iterator[Finding]:
    """Imports and uses of `gc` beyond SAFE_GC: the module as a value (`getattr(gc, ...)`),
    another name, or anything reached through a safe one (`gc.collect.__self__` is `gc`)."""
    for node in ctx.nodes(ast.Import, ast.ImportFrom):
        if isinstance(node, ast.ImportFrom) and node.module == "gc":
            yield from (Finding(node.lineno, f"imports gc.{a.name}") for a in node.names
                        if a.name not in SAFE_GC)
    for node in ctx.nodes(ast.Name, ast.Attribute):
        parts = ctx.full(node).split(".")
        if parts[0] != "gc" or len(parts) > 2:
            continue
        parent = parents.get(node)
        through = isinstance(parent, ast.Attribute) and parent.value is node
        if (len(parts) == 1 and not through) or \
                (len(parts) == 2 and (parts[1] not in SAFE_GC or through)):
            yield Finding(node.lineno, f"uses {'.'.join(parts)}"  # type: ignore[attr-defined]
                          + (" as a value" if len(parts) == 1 else ""))


def _dunder(node: ast.AST | None) -> bool:
    return isinstance(node, ast.Constant) and isinstance(node.value, str) and \
        node.value.startswith("__") and node.value.endswith("__")


def _own_namespace_use(call: ast.Call, parents: dict[ast.AST, ast.AST]) -> bool:
    """`globals()` / `vars()` subscripted, tested with `in`, or used through a dict method,
    with no literal dunder key: a kernel registry looked up by name."""
    parent = parents.get(call)
    if isinstance(parent, ast.Subscript) and parent.value is call:
        return not _dunder(parent.slice)
    if isinstance(parent, ast.Compare) and call in parent.comparators:
        return all(isinstance(op, (ast.In, ast.NotIn)) for op in parent.ops) and \
            not _dunder(parent.left)
    if isinstance(parent, ast.Attribute) and parent.attr in NAMESPACE_METHODS:
        method_call = parents.get(parent)
        return isinstance(method_call, ast.Call) and method_call.func is parent and \
            not any(_dunder(a) for a in method_call.args)
    return False


@rule("frame_introspection")
def _introspection(ctx: Context) -> list[Finding]:
    parents = _parents(ctx)
    out = [Finding(n.lineno, f"imports {name}") for n, name in _imported_modules(ctx)
           if _matches(name, INTROSPECTION_MODULES - {"gc"})]
    out += _gc_uses(ctx, parents)
    for node in ctx.nodes(ast.Attribute):
        attr = node.attr  # type: ignore[attr-defined]
        if attr in INTROSPECTION_ATTRS and (attr != "modules" or ctx.full(node) == "sys.modules"):
            out.append(Finding(node.lineno, f"uses .{attr}"))
    for call, name in ctx.calls():
        if name in INTROSPECTION_CALLS and not call.args and \
                not _own_namespace_use(call, parents):
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
            if name.split(".")[0] in ("problems", "kernelbench", "evaluator", "kloop")]
    return out


@rule("identity_keyed_cache")
def _identity_cache(ctx: Context) -> list[Finding]:
    return [Finding(line, "keys a persistent cache by tensor identity/pointer")
            for line, kind in cache_lookups(ctx) if kind == "identity"]


@rule("shape_keyed_cache")
def _shape_cache(ctx: Context) -> list[Finding]:
    out = [Finding(line, "keys a persistent cache by tensor shape")
           for line, kind in cache_lookups(ctx) if kind == "shape"]
    for fn in ctx.nodes(ast.FunctionDef, ast.AsyncFunctionDef):
        for dec in fn.decorator_list:  # type: ignore[attr-defined]
            name = ctx.full(dec.func if isinstance(dec, ast.Call) else dec)
            if name.split(".")[-1] in ("lru_cache", "cache") and \
                    not memoises_scalars_only(ctx, fn):  # type: ignore[arg-type]
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


def _strict_value(node: ast.AST | None, value: object) -> bool:
    return isinstance(node, ast.Constant) and type(node.value) is type(value) and \
        node.value == value


def _strict_precision_call(call: ast.Call) -> bool:
    """`torch.set_float32_matmul_precision("highest")`: strict's (and PyTorch's default)."""
    args = [*call.args, *(k.value for k in call.keywords if k.arg == "precision")]
    return len(args) == 1 and len(call.args) + len(call.keywords) == 1 and \
        _strict_value(args[0], "highest")


@rule("global_backend_flags")
def _backend_flags(ctx: Context) -> list[Finding]:
    out = []
    for node in ctx.nodes(ast.Assign, ast.AugAssign, ast.AnnAssign):
        targets = node.targets if isinstance(node, ast.Assign) else [node.target]
        for t in targets:
            full = ctx.full(t) if isinstance(t, ast.Attribute) else ""
            # TF32 turned off (given as the literal False) is strict's own setting.
            if full.startswith("torch.backends.") and not (
                    full in STRICT_FALSE_FLAGS and isinstance(node, ast.Assign)
                    and _strict_value(node.value, False)):
                out.append(Finding(node.lineno, f"sets {full}"))
    for call, name in ctx.calls():
        if name == "torch.set_float32_matmul_precision" and _strict_precision_call(call):
            continue
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
