"""Compile the Triton kernels a candidate actually launched for a real GPU target, without a GPU.

On CPU the candidate runs under the Triton interpreter, which accepts programs the GPU compiler
rejects (`tl.dot` with K < 16, too much shared memory, …). A kernel's signature is only known from
a call, so `install_triton_launch_recorder()` wraps the interpreter's launch path and records each
distinct specialisation (argument types as Triton spells them, constexpr values, num_warps,
num_stages). After the CPU correctness run, `triton_aot_check()` compiles exactly those
specialisations for `GPUTarget("cuda", arch, 32)` and reports errors, registers and spills.

Triton's internal APIs move between releases (3.6 on the GPU box, 3.7 here), so every
version-specific call has a fallback and an API failure is reported as `infra_error`, never as
the candidate's fault.
"""

from __future__ import annotations

import contextlib
import inspect
import logging
import tempfile
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from kloop.evaluator.build.diagnostics import diagnostic_from_exception, make_compile_log
from kloop.evaluator.build.triton_compat import compiler_mode, snapshot_language, to_jit
from kloop.evaluator.common.resources import cubin_resources
from kloop.evaluator.common.result import CompileDiagnostic, CompileLog, KernelResources
from pydantic import BaseModel, ConfigDict, Field

log = logging.getLogger(__name__)

_LAUNCH_OPTIONS = ("num_warps", "num_stages", "num_ctas", "maxnreg")
# Largest dynamic shared memory one block may opt into, by compute capability.
MAX_SHARED_BYTES = {80: 166912, 86: 101376, 87: 166912, 89: 101376, 90: 232448, 100: 232448,
                    120: 101376}

JsonScalar = str | int | float | bool | None


class TritonLaunch(BaseModel):
    """One distinct specialisation of a kernel launched by the candidate."""

    model_config = ConfigDict(extra="forbid")

    kernel: str
    signature: dict[str, str]
    """Parameter -> Triton type (`*fp32`, `i32`, `fp32`, or `constexpr`)."""
    constexprs: dict[str, JsonScalar] = Field(default_factory=dict)
    divisible_16: list[str] = Field(default_factory=list)
    """Parameters the JIT would specialise as divisible by 16 (pointers and integers)."""
    options: dict[str, int] = Field(default_factory=dict)
    """num_warps / num_stages / … given at launch."""
    calls: int = 1


class _Recorded(BaseModel):
    model_config = ConfigDict(arbitrary_types_allowed=True)

    fn: Any
    launch: TritonLaunch
    constexpr_values: dict[str, Any]


_RECORDS: dict[str, _Recorded] = {}
_original_run: Callable[..., Any] | None = None


def _is_constexpr_annotation(ann: Any) -> bool:
    try:
        from triton.runtime.jit import _normalize_ty

        return _normalize_ty(ann) == "constexpr"
    except (ImportError, AttributeError, TypeError):
        return "constexpr" in str(ann)


def _specialise(value: Any) -> tuple[str, bool]:
    """(Triton type string, divisible by 16) as the JIT would specialise this argument."""
    try:
        from triton.backends.compiler import BaseBackend
        from triton.runtime.jit import native_specialize_impl

        ty, key = native_specialize_impl(BaseBackend, value, False, True, True)
        return str(ty), key == "D"
    except (ImportError, TypeError, AttributeError):
        from triton.runtime.jit import mangle_type

        return str(mangle_type(value)), False


def _jsonable(value: Any) -> JsonScalar:
    return value if isinstance(value, (str, int, float, bool)) or value is None else str(value)


def _describe(fn: Any, args: tuple, kwargs: dict[str, Any]) -> _Recorded:
    raw = getattr(fn, "fn", fn)
    params = inspect.signature(raw).parameters
    options = {k: int(kwargs[k]) for k in _LAUNCH_OPTIONS if isinstance(kwargs.get(k), int)}
    call_kwargs = {k: v for k, v in kwargs.items() if k in params}
    bound = inspect.signature(raw).bind(*args, **call_kwargs)
    bound.apply_defaults()
    signature: dict[str, str] = {}
    values: dict[str, Any] = {}
    divisible: list[str] = []
    for name, value in bound.arguments.items():
        if _is_constexpr_annotation(params[name].annotation):
            signature[name], values[name] = "constexpr", value
            continue
        ty, div = _specialise(value)
        signature[name] = ty
        if ty == "constexpr":
            values[name] = value
        elif div:
            divisible.append(name)
    launch = TritonLaunch(
        kernel=raw.__name__, signature=signature,
        constexprs={k: _jsonable(v) for k, v in values.items()},
        divisible_16=divisible, options=options,
    )
    return _Recorded(fn=fn, launch=launch, constexpr_values=values)


def _record(fn: Any, args: tuple, kwargs: dict[str, Any]) -> None:
    rec = _describe(fn, args, kwargs)
    key = rec.launch.model_dump_json(exclude={"calls"})
    if key in _RECORDS:
        _RECORDS[key].launch.calls += 1
    else:
        _RECORDS[key] = rec


def install_triton_launch_recorder() -> bool:
    """Record every interpreter launch (see module doc); False when the interpreter is absent.

    Each launch also runs inside a `torch.profiler.record_function` range named after the kernel,
    so a CPU profile can attribute the interpreter's time to the candidate's kernels.
    """
    global _original_run
    try:
        from triton.runtime.interpreter import InterpretedFunction
    except ImportError:
        log.warning("triton interpreter not importable; launches will not be recorded")
        return False
    if _original_run is not None:
        return True
    import torch

    snapshot_language()
    _original_run = original = InterpretedFunction.run

    def run(self, *args, grid, warmup, **kwargs):
        try:
            _record(self, args, kwargs)
        except Exception:  # recording must never change what the candidate sees
            log.warning("could not record a launch of %s", getattr(self, "__name__", self),
                        exc_info=True)
        with torch.profiler.record_function(getattr(self.fn, "__name__", "triton_kernel")):
            return original(self, *args, grid=grid, warmup=warmup, **kwargs)

    InterpretedFunction.run = run
    return True


def uninstall_triton_launch_recorder() -> None:
    global _original_run
    if _original_run is not None:
        from triton.runtime.interpreter import InterpretedFunction

        InterpretedFunction.run = _original_run
        _original_run = None


def recorded_launches() -> list[TritonLaunch]:
    return [r.launch for r in _RECORDS.values()]


def clear_recorded_launches() -> None:
    _RECORDS.clear()


def _aot_api() -> tuple[Callable[..., Any], Any, Any]:
    """(triton.compile, GPUTarget, ASTSource); ImportError/AttributeError on an unknown version."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    return triton.compile, GPUTarget, ASTSource


def _compile_one(rec: _Recorded, arch: int, api) -> Any:
    compile_fn, gpu_target, ast_source = api
    names = list(rec.launch.signature)
    attrs = {(names.index(n),): [["tt.divisibility", 16]] for n in rec.launch.divisible_16}
    options = {"num_warps": 4, "num_stages": 3, **rec.launch.options}
    with compiler_mode():
        src = ast_source(to_jit(rec.fn), dict(rec.launch.signature), dict(rec.constexpr_values),
                         attrs)
        return compile_fn(src, target=gpu_target("cuda", arch, 32), options=options)


def _shared_memory_error(kernel: Any, launch: TritonLaunch, arch: int) -> CompileDiagnostic | None:
    limit = MAX_SHARED_BYTES.get(arch)
    shared = getattr(getattr(kernel, "metadata", None), "shared", None)
    if limit is None or not isinstance(shared, int) or shared <= limit:
        return None
    return CompileDiagnostic(message=(
        f"{launch.kernel} {launch.constexprs} needs {shared} bytes of shared memory; sm_{arch} "
        f"allows {limit} per block, so the launch would fail (use smaller blocks or num_stages)"
    ))


def _resources(kernel: Any, name: str, work_dir: Path) -> list[KernelResources]:
    asm = getattr(kernel, "asm", {}) or {}
    found = cubin_resources(asm["cubin"], work_dir) if "cubin" in asm else []
    shared = getattr(getattr(kernel, "metadata", None), "shared", None)
    if not found:
        return [KernelResources(kernel=name, shared_bytes=shared)]
    return [r.model_copy(update={"shared_bytes": shared}) for r in found]


def _source_file(fn: Any) -> str | None:
    try:
        return inspect.getsourcefile(getattr(fn, "fn", fn))
    except TypeError:
        return None


def _merge(diags: list[CompileDiagnostic]) -> list[CompileDiagnostic]:
    merged: dict[tuple[Any, ...], CompileDiagnostic] = {}
    for d in diags:
        key = (d.file, d.line, d.column, d.message)
        if key in merged:
            merged[key].count += 1
        else:
            merged[key] = d.model_copy()
    return list(merged.values())


def triton_aot_check(
    kernels_and_signatures: Iterable[tuple[Any, TritonLaunch]] | None = None,
    arch: int = 90,
    *,
    candidate_path: str | Path | None = None,
    work_dir: Path | None = None,
) -> CompileLog:
    """Compile each (kernel, launch) for `GPUTarget("cuda", arch, 32)`; default: the recorded ones.

    `kernel` may be an interpreted kernel, a JITFunction or the plain Python function.
    """
    if kernels_and_signatures is None:
        recs = list(_RECORDS.values())
    else:
        recs = [_Recorded(fn=fn, launch=launch, constexpr_values=dict(launch.constexprs))
                for fn, launch in kernels_and_signatures]
    target = f"sm_{arch}"
    start = time.monotonic()
    work = work_dir or Path(tempfile.mkdtemp(prefix="kloop-triton-aot-"))
    diags: list[CompileDiagnostic] = []
    resources: list[KernelResources] = []
    lines: list[str] = []
    try:
        api = _aot_api()
    except (ImportError, AttributeError) as exc:
        return CompileLog(backend="triton", ok=False, target=target,
                          infra_error=f"Triton AOT API unavailable in this version: {exc!r}")
    for rec in recs:
        desc = f"{rec.launch.kernel} {rec.launch.signature} {rec.launch.options}"
        try:
            kernel = _compile_one(rec, arch, api)
        except Exception as exc:
            lines.append(f"FAILED {desc}\n{exc}")
            diags.append(diagnostic_from_exception(exc, candidate_path or _source_file(rec.fn)))
            continue
        lines.append(f"ok {desc}")
        with contextlib.suppress(Exception):  # resource reporting is best effort
            resources += _resources(kernel, rec.launch.kernel, work / rec.launch.kernel)
        shared_err = _shared_memory_error(kernel, rec.launch, arch)
        if shared_err is not None:
            diags.append(shared_err)
    return make_compile_log(
        "triton", not diags, "\n".join(lines), _merge(diags), work / "triton_aot.log",
        target=target, resources=resources, seconds=time.monotonic() - start,
    )
