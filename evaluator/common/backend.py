"""Which backend a candidate uses, and which kernel names are its own, read from its Python AST.

The candidate is never imported here: detection must be safe on untrusted source, so it works on
the syntax tree only. CUDA kernel names are read from the C++ strings the module contains (a C++
parser would be overkill for finding `__global__` declarations).
"""

from __future__ import annotations

import ast
import re
from typing import Literal

BackendName = Literal["cuda", "triton", "torch"]

_CPP_EXTENSION = "torch.utils.cpp_extension"
_LOADERS = {"load_inline", "load"}
_TRITON_DECORATORS = {"jit", "autotune", "heuristics"}

_CPP_COMMENT = re.compile(r"//[^\n]*|/\*.*?\*/", re.DOTALL)
_LAUNCH_BOUNDS = re.compile(r"__launch_bounds__\s*\([^)]*\)")
_GLOBAL_FN = re.compile(r"__global__\b([^;{}()]*?)\b([A-Za-z_]\w*)\s*\(")


def _dotted(node: ast.AST) -> str | None:
    """`a.b.c` for a Name/Attribute chain, else None."""
    parts: list[str] = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        parts.append(node.id)
        return ".".join(reversed(parts))
    return None


class _Imports(ast.NodeVisitor):
    """Maps the local names bound by imports to the full dotted names they stand for."""

    def __init__(self) -> None:
        self.module_alias: dict[str, str] = {}  # local name -> full dotted name

    def visit_Import(self, node: ast.Import) -> None:
        for a in node.names:
            if a.asname:
                self.module_alias[a.asname] = a.name
            else:
                top = a.name.split(".")[0]
                self.module_alias[top] = top

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        mod = node.module or ""
        for a in node.names:
            full = f"{mod}.{a.name}" if mod else a.name
            # Binds a module (`from torch.utils import cpp_extension`) or a function
            # (`from triton import jit`); both resolve the same way.
            self.module_alias[a.asname or a.name] = full

    def resolve(self, node: ast.AST) -> str | None:
        """Full dotted name of an expression, with the first component's alias expanded."""
        name = _dotted(node)
        if name is None:
            return None
        head, _, rest = name.partition(".")
        if head in self.module_alias:
            head = self.module_alias[head]
        return f"{head}.{rest}" if rest else head


def _scan(source: str) -> tuple[ast.Module, _Imports]:
    tree = ast.parse(source)
    imports = _Imports()
    imports.visit(tree)
    return tree, imports


def _is_cpp_loader(call: ast.Call, imports: _Imports) -> str | None:
    """`load_inline` or `load` when the call targets torch.utils.cpp_extension, else None."""
    full = imports.resolve(call.func)
    if full is None:
        return None
    mod, _, fn = full.rpartition(".")
    if fn in _LOADERS and (mod == _CPP_EXTENSION or mod.endswith("cpp_extension")):
        return fn
    return None


def _has_cuda_sources(call: ast.Call, loader: str) -> bool:
    if any(k.arg is None for k in call.keywords):
        return True  # **kwargs: cannot tell, and a cpp_extension build is CUDA in practice
    if loader == "load":
        return True  # file-based builds compile .cu files; a CPU-only `load` is not a GPU kernel
    for k in call.keywords:
        if k.arg == "cuda_sources":
            return not (isinstance(k.value, ast.Constant) and not k.value.value)
    return len(call.args) >= 3


def _triton_decorated(fn: ast.FunctionDef, imports: _Imports) -> bool:
    for dec in fn.decorator_list:
        target = dec.func if isinstance(dec, ast.Call) else dec
        full = imports.resolve(target) or ""
        mod, _, name = full.rpartition(".")
        if name in _TRITON_DECORATORS and mod.split(".")[0] == "triton":
            return True
    return False


def _triton_functions(tree: ast.Module, imports: _Imports) -> set[str]:
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and _triton_decorated(
            node, imports
        ):
            names.add(node.name)
        elif isinstance(node, ast.Call) and (imports.resolve(node.func) or "") == "triton.jit":
            names.update(a.id for a in node.args if isinstance(a, ast.Name))
    return names


def _calls_cuda_loader(tree: ast.Module, imports: _Imports) -> bool:
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            loader = _is_cpp_loader(node, imports)
            if loader and _has_cuda_sources(node, loader):
                return True
    return False


def detect_backend(source: str) -> BackendName:
    """Classify a candidate as `cuda`, `triton` or `torch` from its syntax tree.

    `cuda` when it builds a CUDA extension through `torch.utils.cpp_extension.load_inline` (with
    `cuda_sources`) or `load`; `triton` when it defines `@triton.jit` functions (possibly under
    `triton.autotune`/`triton.heuristics`); `torch` otherwise. A candidate that does both is
    `cuda`, because its build needs nvcc. Raises `SyntaxError` on unparsable source.
    """
    tree, imports = _scan(source)
    if _calls_cuda_loader(tree, imports):
        return "cuda"
    if _triton_functions(tree, imports):
        return "triton"
    return "torch"


def cuda_kernel_names(cuda_text: str) -> set[str]:
    """Names of the `__global__` functions declared in a CUDA C++ source text."""
    text = _LAUNCH_BOUNDS.sub(" ", _CPP_COMMENT.sub(" ", cuda_text))
    return {m.group(2) for m in _GLOBAL_FN.finditer(text)}


def _string_constants(tree: ast.Module) -> list[str]:
    return [
        n.value for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str)
    ]


def custom_kernel_names(source: str) -> set[str]:
    """The candidate's own kernel names: `__global__` functions in its CUDA strings and
    `@triton.jit` functions. Profiling uses them to tell custom kernels from library ones."""
    tree, imports = _scan(source)
    names = _triton_functions(tree, imports)
    for text in _string_constants(tree):
        if "__global__" in text:
            names |= cuda_kernel_names(text)
    return names
