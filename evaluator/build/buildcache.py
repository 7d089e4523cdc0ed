"""The candidate process's side of the `load_inline` build cache (see `evaluator.build.buildstore`).

The candidate calls `torch.utils.cpp_extension.load_inline` at import time. We replace it with a
wrapper that keys the build on everything that changes the binary (sources, flags, torch and CUDA
versions, GPU arch, Python ABI) and on the sha256 of the whole candidate file. A hit imports the
built `.so` directly, with no FileBaton lock, so a build killed half-way can never leave a stale
lock behind: first from `verified_root/<key>`, the read-only copies of earlier builds of this very
file that the harness checked against its manifest, then from `cache_root/<key>`, the private
build directory of this evaluation. A miss builds with the real `load_inline` into a temporary
directory that is atomically renamed to `cache_root/<key>` once complete (if another process of
this evaluation finished the same key first, theirs stays). Nothing in this process writes a
cache another evaluation reads: after the compile child exits, the harness installs what it
built (`buildstore.install`).

On a machine without CUDA the check-only mode records the call, compile-checks the sources with
nvcc and raises `CudaNotAvailable` carrying the CompileLog, so the child can report `not_run` with
real compile feedback. Every call appends a `BuildRecord` to `BUILD_RECORDS`, which the child
reads whatever the candidate did with the exception.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import inspect
import json
import logging
import os
import re
import shlex
import shutil
import sys
import sysconfig
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict

from kloop.evaluator.build import cxx_pch, lean, nvcc_parallel, pch
from kloop.evaluator.build.diagnostics import build_source_map, make_compile_log, parse_nvcc_log
from kloop.evaluator.build.nvcc import (
    CPP_IMPLICIT_HEADERS,
    CUDA_IMPLICIT_HEADERS,
    as_list,
    nvcc_check,
    nvcc_version,
)
from kloop.evaluator.common.result import CompileLog

log = logging.getLogger(__name__)

KEY_VERSION = 2
META_FILE = "kloop_build.json"
_STALE_TMP_S = 24 * 3600
# Arguments that do not change the built binary.
_NOT_IN_KEY = {"build_directory", "verbose", "keep_intermediates"}
NVCC_PARALLEL = Path(__file__).with_name("nvcc_parallel.py")
_SINGLE_ARCH = re.compile(r"(?:sm_|compute_)?(\d+)(?:\.(\d))?(a)?")


class BuildRecord(BaseModel):
    """One `load_inline` call made by the candidate."""

    model_config = ConfigDict(extra="forbid")

    name: str
    key: str
    mode: Literal["build", "check"]
    cache_hit: bool
    ok: bool
    seconds: float
    path: str | None = None
    """The cache entry (build mode) or check directory (check mode)."""
    compile: CompileLog | None = None
    cxx_runs: list[str] = []
    """Each compile of the binding file (`evaluator.build.cxx_pch`): `pch` (torch's header
    precompiled) or `plain: <why>`; empty when the host compiler never compiled it."""
    nvcc_runs: list[str] = []
    """Each run of `evaluator.build.nvcc_parallel` (torch's nvcc in a GPU build): `split` (host
    and device chains side by side) or `plain: <why>`; empty when it did not run."""


BUILD_RECORDS: list[BuildRecord] = []
LOADED_MODULES: list[Any] = []
"""The extension modules handed to the candidate (the ghost-kernel check stubs their functions)."""


class CudaNotAvailable(BaseException):
    """Raised instead of building a CUDA extension on a machine without CUDA.

    A BaseException so that a candidate's `except Exception` around `load_inline` does not
    swallow it; the BuildRecord is written before it is raised in any case.
    """

    def __init__(self, compile_log: CompileLog) -> None:
        super().__init__("CUDA is not available here; the sources were only compile-checked")
        self.compile_log = compile_log


class _Installed(BaseModel):
    model_config = ConfigDict(arbitrary_types_allowed=True)

    real: Any
    mode: Literal["build", "check"]
    cache_root: Path
    verified_root: Path | None = None
    arch: str | None
    work_root: Path | None = None
    timeout_s: float = 300.0
    candidate_source: str | None = None
    candidate_name: str | None = None


_state: _Installed | None = None


def normalise_arch(arch: str | None) -> str | None:
    """`sm_90` / `9.0` / `90` -> `sm_90` (`9.0a` -> `sm_90a`); a list such as `8.0;9.0+PTX`
    is returned unchanged (it still keys the cache, and torch reads it from the environment)."""
    if not arch or not arch.strip():
        return None
    m = _SINGLE_ARCH.fullmatch(arch.strip())
    if m is None:
        return arch.strip()
    return f"sm_{m.group(1)}{m.group(2) or ''}{m.group(3) or ''}"


def _torch_arch_list(arch: str) -> str | None:
    """`sm_90a` -> `9.0a`, the TORCH_CUDA_ARCH_LIST spelling; None for anything but one arch."""
    m = re.fullmatch(r"sm_(\d+)(\d)(a?)", arch)
    return f"{m.group(1)}.{m.group(2)}{m.group(3)}" if m else None


def _detect_arch() -> str | None:
    import torch

    if torch.cuda.is_available():
        major, minor = torch.cuda.get_device_capability()
        return f"sm_{major}{minor}"
    return None


def build_key(args: dict[str, Any], arch: str | None, candidate_sha256: str | None) -> str:
    """sha256 over the build inputs, the toolchain and the candidate file that made the call."""
    import torch

    payload = {
        "v": KEY_VERSION,
        "candidate": candidate_sha256,
        "args": {k: v for k, v in sorted(args.items()) if k not in _NOT_IN_KEY},
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "nvcc": nvcc_version(),
        "arch": arch,
        "python": [sys.implementation.cache_tag, sysconfig.get_config_var("EXT_SUFFIX")],
    }
    if os.environ.get(lean.ENV) == "1":  # a lean build is another binary (keys without it stay)
        payload["lean"] = "lean+torch-form"  # torch-form files are built as two halves too
    return hashlib.sha256(json.dumps(payload, sort_keys=True, default=repr).encode()).hexdigest()


def _bind(real: Callable[..., Any], args: tuple, kwargs: dict) -> dict[str, Any]:
    bound = inspect.signature(real).bind(*args, **kwargs)
    bound.apply_defaults()
    out = dict(bound.arguments)
    for k in ("cpp_sources", "cuda_sources"):
        out[k] = as_list(out.get(k))
    return out


def _import_built(entry: Path) -> Any:
    meta = json.loads((entry / META_FILE).read_text())
    so = entry / meta["so"]
    if not meta["is_python_module"]:
        import torch

        torch.ops.load_library(str(so))
        return str(so)
    spec = importlib.util.spec_from_file_location(meta["module"], so)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot import {so}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    LOADED_MODULES.append(module)
    return module


def _source_maps(args: dict[str, Any]) -> dict:
    st = _state
    assert st is not None
    implicit = not args.get("no_implicit_headers", False)
    cpp = as_list(args.get("cpp_sources"))
    return {
        "main.cpp": build_source_map(
            "main.cpp", len(CPP_IMPLICIT_HEADERS) if implicit else 0,
            [("cpp_sources", p) for p in cpp], st.candidate_source, st.candidate_name),
        "cuda.cu": build_source_map(
            "cuda.cu", len(CUDA_IMPLICIT_HEADERS) if implicit else 0,
            [("cuda_sources", p) for p in as_list(args.get("cuda_sources"))],
            st.candidate_source, st.candidate_name),
    }


def _failed_log(exc: BaseException, args: dict[str, Any], log_path: Path) -> CompileLog:
    text = f"{type(exc).__name__}: {exc}"
    backend = "cuda" if args.get("cuda_sources") else "torch"
    return make_compile_log(backend, False, text, parse_nvcc_log(text, _source_maps(args)),
                            log_path, target=_state.arch if _state else None)


def _publish(tmp: Path, entry: Path, result: Any, args: dict[str, Any]) -> None:
    """Write the metadata, then move the finished build to its final name in one rename."""
    if args.get("is_python_module", True):
        module, so = result.__name__, Path(result.__file__).name
    else:
        so = Path(result).name
        module = Path(result).stem
    (tmp / META_FILE).write_text(json.dumps(
        {"module": module, "so": so, "is_python_module": bool(args.get("is_python_module", True))}
    ))
    for obj in tmp.glob("*.o"):
        obj.unlink()  # intermediates only; the .so is all a hit needs
    try:
        os.rename(tmp, entry)
    except OSError:
        # Another process published the same key first; both builds are equivalent.
        shutil.rmtree(tmp, ignore_errors=True)


@contextlib.contextmanager
def _env(values: dict[str, str]) -> Iterator[None]:
    """`values` in the environment for the block only (the hook may run in a caller's own
    process, not only in a compile child)."""
    before = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in before.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _runs(report: Path) -> list[str]:
    """What `evaluator.build.nvcc_parallel` or `cxx_pch` reported for this build (the file
    goes: it is not part of what is published)."""
    try:
        runs = report.read_text().splitlines()[:16]
    except OSError:
        return []
    report.unlink(missing_ok=True)
    return runs


def parallel_nvcc_env() -> dict[str, str]:
    """The environment under which torch's build calls `evaluator.build.nvcc_parallel` as its
    nvcc; empty when the user chose an nvcc (`PYTORCH_NVCC`) or torch has no CUDA home. Without
    nvcc's `-MD` dependency output (a step nvcc runs internally, which the split cannot): every
    build gets a fresh directory, so ninja never reads it."""
    from torch.utils import cpp_extension

    home = getattr(cpp_extension, "CUDA_HOME", None)
    if not home or not (Path(home) / "bin" / "nvcc").is_file() or "PYTORCH_NVCC" in os.environ:
        return {}
    return {"PYTORCH_NVCC": shlex.join([sys.executable, str(NVCC_PARALLEL), "--nvcc",
                                        str(Path(home) / "bin" / "nvcc")]),
            "TORCH_EXTENSION_SKIP_NVCC_GEN_DEPENDENCIES": "1"}


def _hit(key: str) -> Path | None:
    st = _state
    assert st is not None
    for root in (st.verified_root, st.cache_root):
        if root is not None and (root / key / META_FILE).is_file():
            return root / key
    return None


def _build(args: dict[str, Any], key: str) -> Any:
    st = _state
    assert st is not None
    entry = _hit(key) or st.cache_root / key
    start = time.monotonic()
    if (entry / META_FILE).is_file():
        try:
            result = _import_built(entry)
        except Exception as exc:
            BUILD_RECORDS.append(BuildRecord(
                name=args["name"], key=key, mode="build", cache_hit=True, ok=False,
                seconds=time.monotonic() - start, path=str(entry),
                compile=_failed_log(exc, args, st.cache_root / "logs" / f"{key}.log")))
            raise
        BUILD_RECORDS.append(BuildRecord(
            name=args["name"], key=key, mode="build", cache_hit=True, ok=True,
            seconds=time.monotonic() - start, path=str(entry)))
        return result
    tmp = st.cache_root / f".tmp-{key[:16]}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    tmp.mkdir(parents=True)
    call = dict(args, build_directory=str(tmp))
    call["cpp_sources"], call["cuda_sources"] = list(args["cpp_sources"]), list(args["cuda_sources"])
    env = parallel_nvcc_env() if call["cuda_sources"] else {}
    report, cxx_report = tmp / "nvcc-runs.txt", tmp / "cxx-runs.txt"
    pch_root = os.environ.get(cxx_pch.ROOT_ENV)
    env.update(pch.compiler_env(tmp, Path(pch_root) if pch_root else None, cxx_report))
    try:
        with _env({**env, nvcc_parallel.REPORT_ENV: str(report)}):
            result = st.real(**call)
    except Exception as exc:
        clog = _failed_log(exc, args, st.cache_root / "logs" / f"{key}.log")
        BUILD_RECORDS.append(BuildRecord(
            name=args["name"], key=key, mode="build", cache_hit=False, ok=False,
            seconds=time.monotonic() - start, compile=clog,
            nvcc_runs=_runs(report), cxx_runs=_runs(cxx_report)))
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    runs, cxx_runs = _runs(report), _runs(cxx_report)
    (tmp / pch.LAUNCHER).unlink(missing_ok=True)
    _publish(tmp, entry, result, args)
    if args.get("is_python_module", True):
        LOADED_MODULES.append(result)
    BUILD_RECORDS.append(BuildRecord(
        name=args["name"], key=key, mode="build", cache_hit=False, ok=True,
        seconds=time.monotonic() - start, path=str(entry), nvcc_runs=runs, cxx_runs=cxx_runs))
    return result


def _check(args: dict[str, Any], key: str) -> None:
    st = _state
    assert st is not None and st.work_root is not None
    start = time.monotonic()
    work = st.work_root / f"{args['name']}-{key[:12]}"
    clog = nvcc_check(
        args["cuda_sources"], args["cpp_sources"], args.get("extra_cuda_cflags"), work,
        arch=st.arch or "sm_90", timeout_s=st.timeout_s, functions=args.get("functions"),
        extra_cflags=args.get("extra_cflags"),
        extra_include_dirs=as_list(args.get("extra_include_paths")),
        no_implicit_headers=bool(args.get("no_implicit_headers", False)),
        candidate_source=st.candidate_source, candidate_name=st.candidate_name,
    )
    BUILD_RECORDS.append(BuildRecord(
        name=args["name"], key=key, mode="check", cache_hit=clog.cache_hit, ok=clog.ok,
        seconds=time.monotonic() - start, path=str(work), compile=clog))
    raise CudaNotAvailable(clog)


def _wrapper(*args: Any, **kwargs: Any) -> Any:
    st = _state
    assert st is not None, "load_inline hook called after uninstall()"
    bound = _bind(st.real, args, kwargs)
    digest = hashlib.sha256(st.candidate_source.encode()).hexdigest() \
        if st.candidate_source is not None else None
    key = build_key(bound, st.arch, digest)
    if st.mode == "check" and bound["cuda_sources"]:
        _check(bound, key)
    return _build(bound, key)


def _clean_stale(cache_root: Path) -> None:
    now = time.time()
    for tmp in cache_root.glob(".tmp-*"):
        try:
            if now - tmp.stat().st_mtime > _STALE_TMP_S:
                shutil.rmtree(tmp, ignore_errors=True)
        except OSError:
            pass


def _install(state: _Installed) -> None:
    global _state
    import torch.utils.cpp_extension as cpp_ext

    if _state is None:
        state.real = cpp_ext.load_inline
    else:
        state.real = _state.real
    state.cache_root.mkdir(parents=True, exist_ok=True)
    _clean_stale(state.cache_root)
    arch_list = _torch_arch_list(state.arch) if state.arch else None
    if arch_list and state.mode == "build":
        # torch reads the target list from here; pin it so the key and the binary agree.
        os.environ["TORCH_CUDA_ARCH_LIST"] = arch_list
    _state = state
    cpp_ext.load_inline = _wrapper


def install_load_inline_cache(
    cache_root: Path,
    *,
    arch: str | None,
    verified_root: Path | None = None,
    candidate_source: str | None = None,
    candidate_name: str | None = None,
) -> None:
    """Replace `torch.utils.cpp_extension.load_inline` with the cached build (see module doc).

    `cache_root` is this evaluation's private build directory, `verified_root` the read-only
    builds the harness staged for this candidate file. `arch` (`sm_90`, `9.0`) defaults to the
    current device's. Call before importing the candidate.
    """
    _install(_Installed(
        real=None, mode="build", cache_root=cache_root, verified_root=verified_root,
        arch=normalise_arch(arch) or _detect_arch(),
        candidate_source=candidate_source, candidate_name=candidate_name,
    ))


def install_compile_check_only(
    cache_root: Path,
    work_root: Path,
    *,
    arch: str = "sm_90",
    timeout_s: float = 300.0,
    verified_root: Path | None = None,
    candidate_source: str | None = None,
    candidate_name: str | None = None,
) -> None:
    """On a machine without CUDA: compile-check CUDA extensions and raise `CudaNotAvailable`.

    CPU-only extensions (no `cuda_sources`) are still built, as `install_load_inline_cache` does.
    """
    _install(_Installed(
        real=None, mode="check", cache_root=cache_root, verified_root=verified_root,
        arch=normalise_arch(arch), work_root=work_root, timeout_s=timeout_s,
        candidate_source=candidate_source, candidate_name=candidate_name,
    ))


def uninstall() -> None:
    """Restore the real `load_inline` (tests; a child process simply exits)."""
    global _state
    import torch.utils.cpp_extension as cpp_ext

    if _state is not None:
        cpp_ext.load_inline = _state.real
        _state = None
