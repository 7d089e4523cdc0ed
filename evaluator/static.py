"""Static anti-cheat rules, run on the candidate's syntax tree before anything executes.

Each rule has a name, a one-line rationale and a severity per policy: under `strict` most
reject, under `kernelbench` every rule only flags (KernelBench main rejects none of these, and
that policy exists to reproduce its numbers). Rules look at what the code does (imports, calls,
assignments, class bases), never at text, so a `try/except` around `load_inline` or a `pass` in
a helper cannot trip them. The runtime checks in the anti-cheat issue back these up: a static
rule can be evaded by code it cannot see (e.g. in a C++ string), and says so in its rationale.
"""

from __future__ import annotations

import ast
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Literal

from evaluator.backend import _Imports
from evaluator.result import Violation

Severity = Literal["reject", "flag"]

INTROSPECTION_MODULES = {"inspect", "gc"}
INTROSPECTION_ATTRS = {
    "_getframe", "f_locals", "f_globals", "f_back", "f_builtins", "f_code", "tb_frame",
    "gi_frame", "cr_frame", "get_objects", "get_referrers", "get_referents", "modules",
}
INTROSPECTION_CALLS = {"globals", "vars"}
CONCURRENCY_MODULES = {"threading", "_thread", "multiprocessing", "concurrent", "subprocess",
                       "asyncio", "pty", "torch.multiprocessing", "sched"}
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
FLAG_CALLS = {"torch.set_float32_matmul_precision", "torch.use_deterministic_algorithms",
              "torch.set_default_dtype", "torch.set_default_device", "torch.set_flush_denormal",
              "torch.backends.cudnn.flags", "torch.backends.cuda.preferred_linalg_library",
              "torch.backends.cuda.preferred_blas_library"}
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


@dataclass(frozen=True)
class Rule:
    name: str
    rationale: str
    check: Callable[[Context], list[Finding]]
    severities: Mapping[str, Severity] = field(default_factory=dict)
    default: Severity = "reject"

    def severity(self, policy: str) -> Severity:
        """Severity under `policy`; policies without an entry get the rule's default."""
        return self.severities.get(policy, self.default)


RULES: dict[str, Rule] = {}


def rule(name: str, rationale: str, *, default: Severity = "reject",
         **severities: Severity) -> Callable[[Callable[[Context], list[Finding]]], Callable]:
    def register(check: Callable[[Context], list[Finding]]) -> Callable:
        per_policy: dict[str, Severity] = {"kernelbench": "flag", **severities}
        RULES[name] = Rule(name, rationale, check, per_policy, default)
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


@rule("frame_introspection",
      "Reading frames, globals or the object graph lets a candidate find the harness's "
      "reference outputs or verdict channel (catalog C10, C11).")
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


@rule("timing_or_comparison_tampering",
      "Reassigning or wrapping torch/time/triton functions (Event, synchronize, perf_counter, "
      "allclose, testing…) can fake timings or comparisons (catalog T3).")
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


@rule("threads_or_processes",
      "Work left running in a thread or process after forward returns escapes the timer "
      "(catalog T2).")
def _concurrency(ctx: Context) -> list[Finding]:
    out = [Finding(n.lineno, f"imports {name}") for n, name in _imported_modules(ctx)
           if _matches(name, CONCURRENCY_MODULES)]
    for call, name in ctx.calls():
        if name.startswith("os.") and name.split(".", 1)[1] in PROCESS_CALLS:
            out.append(Finding(call.lineno, f"calls {name}"))
    return out


@rule("tensor_subclass",
      "A Tensor subclass or a torch function/dispatch mode can defer or fake the computation "
      "until the output is compared (catalog C12).")
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


@rule("reference_model",
      "Subclassing or calling the reference `Model` returns PyTorch's own result with no "
      "kernel of the candidate's (catalog B1, B3).")
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


def _key_kind(ctx: Context, key: ast.AST, local: Mapping[str, ast.AST]) -> str | None:
    """`identity` when a cache key is built from id()/data_ptr()/storage, `shape` when from
    shapes/sizes, following one local assignment (`k = (x.data_ptr(), x.shape)`)."""
    if isinstance(key, ast.Name) and key.id in local:
        key = local[key.id]
    kinds = set()
    for n in ast.walk(key):
        if isinstance(n, ast.Call) and ctx.full(n.func) in ("id", "hash"):
            kinds.add("identity")
        elif isinstance(n, ast.Attribute) and n.attr in IDENTITY_KEYS:
            kinds.add("identity")
        elif isinstance(n, ast.Attribute) and n.attr in SHAPE_KEYS:
            kinds.add("shape")
    return "identity" if "identity" in kinds else "shape" if kinds else None


def _persistent(ctx: Context, node: ast.AST) -> bool:
    """A container that outlives one call: a module global, or an attribute of self/cls."""
    if isinstance(node, ast.Name):
        return node.id in ctx.module_names
    return isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and \
        node.value.id in ("self", "cls")


def _written_containers(ctx: Context) -> set[str]:
    """Source text of every container something is stored into (`c[k] = v`, `c.setdefault`,
    `c.update`...): a table that is only ever read is a constant, not a cache."""
    out = set()
    for n in ctx.nodes(ast.Subscript):
        if isinstance(n.ctx, ast.Store):  # type: ignore[attr-defined]
            out.add(ast.unparse(n.value))  # type: ignore[attr-defined]
    for call in ctx.nodes(ast.Call):
        f = call.func  # type: ignore[attr-defined]
        if isinstance(f, ast.Attribute) and f.attr in ("setdefault", "update", "__setitem__"):
            out.add(ast.unparse(f.value))
    return out


def _cache_lookups(ctx: Context) -> Iterator[tuple[int, str]]:
    """(line, key kind) of every keyed access to a persistent container that is written to."""
    written = _written_containers(ctx)
    for fn in ctx.nodes(ast.FunctionDef, ast.AsyncFunctionDef):
        local = {t.id: n.value for n in ast.walk(fn) if isinstance(n, ast.Assign)
                 for t in n.targets if isinstance(t, ast.Name)}
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


@rule("identity_keyed_cache",
      "A cache keyed by tensor identity or data pointer can return stored outputs instead of "
      "computing them (catalog C4).")
def _identity_cache(ctx: Context) -> list[Finding]:
    return [Finding(line, "keys a persistent cache by tensor identity/pointer")
            for line, kind in _cache_lookups(ctx) if kind == "identity"]


@rule("shape_keyed_cache",
      "Keying by shape is normal for kernel configs but can also memoise outputs (catalog C4); "
      "recorded for review, the runtime re-checks on fresh inputs decide.", default="flag")
def _shape_cache(ctx: Context) -> list[Finding]:
    out = [Finding(line, "keys a persistent cache by tensor shape")
           for line, kind in _cache_lookups(ctx) if kind == "shape"]
    for fn in ctx.nodes(ast.FunctionDef, ast.AsyncFunctionDef):
        for dec in fn.decorator_list:  # type: ignore[attr-defined]
            name = ctx.full(dec.func if isinstance(dec, ast.Call) else dec)
            if name.split(".")[-1] in ("lru_cache", "cache"):
                out.append(Finding(fn.lineno, f"memoises {fn.name} with {name}"))  # type: ignore[attr-defined]
    return out


@rule("global_backend_flags",
      "TF32, cudnn.benchmark or matmul-precision changes give the candidate's library calls "
      "settings the baselines did not get, so the comparison is no longer like for like "
      "(catalog B6, C8).")
def _backend_flags(ctx: Context) -> list[Finding]:
    out = []
    for node in ctx.nodes(ast.Assign, ast.AugAssign, ast.AnnAssign):
        targets = node.targets if isinstance(node, ast.Assign) else [node.target]
        for t in targets:
            if isinstance(t, ast.Attribute) and ctx.full(t).startswith("torch.backends."):
                out.append(Finding(node.lineno, f"sets {ctx.full(t)}"))
    for call, name in ctx.calls():
        if name in FLAG_CALLS:
            out.append(Finding(call.lineno, f"calls {name}"))
    return out


@rule("torch_compile_or_cuda_graph",
      "torch.compile and CUDA graphs are framework speed-ups, not the candidate's kernels; a "
      "policy may allow them, and they are always recorded (catalog B6, T6).")
def _compile_graphs(ctx: Context) -> list[Finding]:
    out = [Finding(call.lineno, f"calls {name}") for call, name in ctx.calls()
           if name in COMPILE_CALLS]
    for fn in ctx.nodes(ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef):
        for dec in fn.decorator_list:  # type: ignore[attr-defined]
            name = ctx.full(dec.func if isinstance(dec, ast.Call) else dec)
            if name in COMPILE_CALLS:
                out.append(Finding(fn.lineno, f"decorates {fn.name} with {name}"))  # type: ignore[attr-defined]
    return out


@rule("dynamic_code",
      "Code built from strings at run time (exec, eval, __import__) is invisible to every "
      "static rule here.")
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
        for f in r.check(ctx):
            if f.line not in seen:
                seen.add(f.line)
                out.append(Violation(rule=r.name, severity=severity, line=f.line,
                                     message=f"{f.message}: {r.rationale}"))
    return sorted(out, key=lambda v: (v.line or 0, v.rule))
