"""Compile-check a torch CUDA extension's sources on a machine that cannot build or run them.

With a CPU-only torch, `load_inline(cuda_sources=...)` cannot link (no libc10_cuda), but nvcc can
still compile the sources against torch's headers, which catches nearly every error a model makes.
`cuda.cu` goes through `nvcc -cubin -Xptxas -v`: the front end for host and device code, device
codegen and ptxas, but no host object, which makes it as fast as `-ptx` while also reporting
registers and spills. A check still costs tens of seconds on two cores, so the compiler output is
cached by content hash; diagnostics are re-derived per candidate because their line mapping depends
on where the strings sit in the candidate file.
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import os
import re
import shutil
import signal
import subprocess
import sys
import sysconfig
import time
import uuid
from collections.abc import Sequence
from pathlib import Path

from pydantic import BaseModel

from kloop.evaluator.build import cxx_pch, lean
from kloop.evaluator.build.diagnostics import (
    build_source_map,
    locate_string,
    make_compile_log,
    parse_nvcc_log,
)
from kloop.evaluator.common.resources import parse_ptxas_verbose
from kloop.evaluator.common.result import CompileDiagnostic, CompileLog

log = logging.getLogger(__name__)

CUDA_IMPLICIT_HEADERS = lean.PROLOGUE
CPP_IMPLICIT_HEADERS = ["#include <torch/extension.h>"]
CHECK_CACHE_ENV = "KLOOP_NVCC_CHECK_CACHE"
CHECK_VERIFIED_ENV = "KLOOP_NVCC_CHECK_VERIFIED"
"""A read-only dir of results the harness installed for this candidate file, looked up first
(see `evaluator.build.buildstore`); new results go to the check cache."""
EXTRA_INCLUDE_ENV = "KLOOP_CUDA_EXTRA_INCLUDE"
"""os.pathsep-separated include dirs, e.g. headers extracted from the nvidia-cublas wheels."""
SDK_HEADERS_DIR = Path(sys.prefix) / "cuda-headers"
"""cuBLAS, cuSPARSE, cuSOLVER, cuRAND and cuFFT headers, installed by scripts/cuda_headers.sh
(`include/`, and `VERSIONS`: the wheels they came from)."""

# Headers a real CUDA machine provides but a compile-only box may lack: missing ones are our
# infrastructure's fault, not the candidate's.
_SDK_HEADER = re.compile(
    r"^(?:cublas|cublasLt|cusparse|cusparseLt|cusolver|cufft|curand|cudnn|nccl|nvrtc|nvToolsExt|"
    r"nvtx3|cuda_cmake_macros|c10/cuda/impl)",
)
_MISSING_HEADER = [
    re.compile(r'cannot open source file "([^"]+)"'),
    re.compile(r"fatal error: ([^:\s]+): No such file or directory"),
]
# Torch's extension defines, plus one standing in for a config header the CPU wheel lacks.
_TORCH_DEFINES = ["-DTORCH_API_INCLUDE_EXTENSION_H", "-DC10_CUDA_NO_CMAKE_CONFIGURE_FILE"]
_NVCC_DEFAULT_FLAGS = [
    "-D__CUDA_NO_HALF_OPERATORS__",
    "-D__CUDA_NO_HALF_CONVERSIONS__",
    "-D__CUDA_NO_BFLOAT16_CONVERSIONS__",
    "-D__CUDA_NO_HALF2_OPERATORS__",
    "--expt-relaxed-constexpr",
]


class RawCheck(BaseModel):
    """What the compilers said; cached by content hash."""

    returncodes: list[int | None]
    output: str
    seconds: float
    timed_out: bool = False


def as_list(sources: str | Sequence[str] | None) -> list[str]:
    if sources is None:
        return []
    return [sources] if isinstance(sources, str) else list(sources)


def binding_lines(functions: str | Sequence[str] | dict[str, str] | None) -> list[str]:
    """The PYBIND11_MODULE block load_inline appends for `functions`."""
    if functions is None:
        return []
    if isinstance(functions, str):
        functions = [functions]
    names = list(functions.keys()) if isinstance(functions, dict) else list(functions)
    body = [f'm.def("{f}", torch::wrap_pybind_function({f}), "{f}");' for f in names]
    return ["PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {", *body, "}"]


def _include_flags(extra_include_dirs: Sequence[str]) -> list[str]:
    from torch.utils.cpp_extension import include_paths

    dirs = list(include_paths())
    dirs.append(sysconfig.get_paths()["include"])
    dirs += _toolkit_include_dirs()
    # pip's nvidia-* wheels (cuBLAS, cuSPARSE…) put their headers under site-packages/nvidia.
    for site in {sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]}:
        dirs += sorted(str(p) for p in Path(site).glob("nvidia/*/include") if p.is_dir())
    if (SDK_HEADERS_DIR / "include").is_dir():
        dirs.append(str(SDK_HEADERS_DIR / "include"))
    env_dirs = os.environ.get(EXTRA_INCLUDE_ENV, "")
    dirs += [d for d in env_dirs.split(os.pathsep) if d] + list(extra_include_dirs)
    flags: list[str] = []
    for d in dirs:
        flags += ["-isystem", d]
    return flags


@functools.lru_cache(maxsize=1)
def _toolkit_include_dirs() -> list[str]:
    """The CUDA toolkit's include dirs as nvcc itself passes them (its `--dryrun`), for g++'s
    check of main.cpp (`cpp_sources` including `<c10/cuda/CUDAStream.h>` needs
    `cuda_runtime_api.h`). Resolving the `nvcc` on PATH is not enough: it may be a wrapper
    script (/usr/local/bin/nvcc here), whose parent holds no toolkit."""
    nvcc = shutil.which("nvcc")
    if nvcc is None:
        return []
    try:
        out = subprocess.run([nvcc, "--dryrun", "-c", "-x", "cu", os.devnull, "-o", os.devnull],
                             capture_output=True, text=True, timeout=30).stderr
    except (OSError, subprocess.SubprocessError):
        out = ""
    dirs = [os.path.normpath(d) for line in out.splitlines()
            if (m := re.match(r"#\$ (?:SYSTEM_)?INCLUDES=(.*)$", line))
            for d in re.findall(r'"?(?:-I|-isystem"? ")([^"\s]+)', m.group(1))]
    return dirs or [str(Path(nvcc).resolve().parent.parent / "include")]


_ARCH_FLAGS = ("-arch", "--gpu-architecture", "-gencode", "--generate-code", "-code", "--gpu-code")


def without_arch_flags(flags: Sequence[str]) -> list[str]:
    """The candidate's nvcc flags minus target selection: the check compiles for one arch, and
    `-cubin` refuses several."""
    out: list[str] = []
    skip_next = False
    for f in flags:
        if skip_next:
            skip_next = False
            continue
        if f in _ARCH_FLAGS:
            skip_next = True
        elif not f.startswith(tuple(a + "=" for a in _ARCH_FLAGS)):
            out.append(f)
    return out


def _std_flag(flags: Sequence[str]) -> list[str]:
    return [] if any(f.startswith("-std=") for f in flags) else ["-std=c++20"]


@functools.lru_cache(maxsize=1)
def nvcc_version() -> str | None:
    """The last line of `nvcc --version` (e.g. `Build cuda_13.0.r13.0/compiler...`), or None."""
    try:
        out = subprocess.run(["nvcc", "--version"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    lines = out.stdout.strip().splitlines()
    return lines[-1] if lines else None


def _toolchain_id() -> str:
    import torch

    try:
        headers = (SDK_HEADERS_DIR / "VERSIONS").read_text().strip()
    except OSError:
        headers = None
    return f"{torch.__version__}|{nvcc_version()}|{sys.version_info[:2]}|{headers}"


def _run_parallel(cmds: list[list[str]], cwd: Path, timeout_s: float) -> RawCheck:
    start = time.monotonic()
    procs = [
        subprocess.Popen(c, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                         start_new_session=True)
        for c in cmds
    ]
    outputs, codes, timed_out = [], [], False
    for p in procs:
        remaining = max(1.0, timeout_s - (time.monotonic() - start))
        try:
            out, _ = p.communicate(timeout=remaining)
        except subprocess.TimeoutExpired:
            timed_out = True
            os.killpg(p.pid, signal.SIGKILL)
            out, _ = p.communicate()
        outputs.append(f"$ {' '.join(p.args)}\n{out}")  # type: ignore[arg-type]
        codes.append(None if timed_out else p.returncode)
    return RawCheck(returncodes=codes, output="\n".join(outputs),
                     seconds=time.monotonic() - start, timed_out=timed_out)


def _missing_infra_header(output: str) -> str | None:
    for pattern in _MISSING_HEADER:
        for m in pattern.finditer(output):
            if _SDK_HEADER.match(m.group(1)):
                return m.group(1)
    return None


def _cache_dir(cache_dir: Path | None) -> Path:
    if cache_dir is not None:
        return cache_dir
    env = os.environ.get(CHECK_CACHE_ENV)
    return Path(env) if env else Path.home() / ".cache" / "kloop" / "nvcc_check"


def _cached_run(key: str, cache_dir: Path, run) -> tuple[RawCheck, bool]:
    path = cache_dir / f"{key}.json"
    verified = os.environ.get(CHECK_VERIFIED_ENV)
    for found in [*([Path(verified) / path.name] if verified else []), path]:
        if found.is_file():
            try:
                return RawCheck.model_validate_json(found.read_text()), True
            except ValueError:
                log.warning("ignoring unreadable compile-check cache entry %s", found)
    raw: RawCheck = run()
    # A check cut short by a header missing here says nothing once it is installed.
    if not raw.timed_out and None not in raw.returncodes and \
            _missing_infra_header(raw.output) is None:
        cache_dir.mkdir(parents=True, exist_ok=True)
        # Not the pid alone: contained children are all pid 1 in their own namespaces.
        tmp = path.with_suffix(f".{os.getpid()}-{uuid.uuid4().hex[:8]}.tmp")
        tmp.write_text(raw.model_dump_json())
        os.replace(tmp, path)
    return raw, False


_CPP_COMMENT = re.compile(r"//[^\n]*|/\*.*?\*/", re.DOTALL)


def _prototypes_only(cpp_parts: Sequence[str]) -> bool:
    """True when cpp_sources only declare functions (the usual KernelBench case)."""
    text = _CPP_COMMENT.sub(" ", "\n".join(cpp_parts))
    return "{" not in text and "#" not in text


def _binding_probes(functions: str | Sequence[str] | dict[str, str] | None) -> list[str]:
    """Lines that fail to compile when a bound function is undeclared or its declaration does not
    match its definition (two overloads make `&f` ambiguous, as `wrap_pybind_function(f)` is)."""
    if functions is None:
        return []
    names = [functions] if isinstance(functions, str) else list(functions)
    return [f"[[maybe_unused]] static const auto kloop_binding_{i} = &{f};"
            for i, f in enumerate(names)]


def _explain_probes(diags: list[CompileDiagnostic], functions) -> list[CompileDiagnostic]:
    names = [functions] if isinstance(functions, str) else list(functions or [])
    out = []
    for d in diags:
        if d.file == "functions" and d.line is not None and d.line <= len(names):
            name = names[d.line - 1]
            d = d.model_copy(update={"file": None, "line": None, "message": (
                f"functions entry {name!r} does not name exactly one declared function: the "
                f"declaration in cpp_sources must match the definition in cuda_sources ({d.message})"
            )})
        out.append(d)
    return out


def _undeclared(functions, cpp_parts: list[str], candidate_source: str | None,
                candidate_name: str | None) -> list[CompileDiagnostic]:
    """What g++ would say of main.cpp when `functions` names something cpp_sources never
    declares (the folded check cannot see it: cuda_sources' definition satisfies nvcc)."""
    names = [functions] if isinstance(functions, str) else list(functions or [])
    text = _CPP_COMMENT.sub(" ", "\n".join(cpp_parts))
    origin = locate_string(candidate_source, cpp_parts[0]) if cpp_parts else None
    return [
        CompileDiagnostic(
            file=candidate_name if origin else "main.cpp", line=origin,
            message=f"'{f}' was not declared in this scope: load_inline binds `functions` in "
            "main.cpp, which sees only cpp_sources, so declare it there",
        )
        for f in names if not re.search(rf"\b{re.escape(f)}\s*\(", text)
    ]


class _Plan(BaseModel):
    files: dict[str, str]
    cmds: list[list[str]]
    maps: dict[str, list[tuple[str, str]]]
    """Per written file: the (label, text) parts after its implicit header lines."""
    prefix: dict[str, int]


CHECK_CXX = "g++"


def _common_flags(extra_include_dirs: Sequence[str]) -> list[str]:
    return [*_include_flags(extra_include_dirs), "-DTORCH_EXTENSION_NAME=kloop_check",
            *_TORCH_DEFINES]


def check_gxx_flags(extra_c: Sequence[str] = (), extra_include_dirs: Sequence[str] = ()) -> list[str]:
    """g++'s flags for main.cpp in a check (`-fsyntax-only main.cpp` added), and the flags of
    the compile check's precompiled header (`evaluator.build.pch.build_check`)."""
    return [*_common_flags(extra_include_dirs), "-fPIC", *extra_c, *_std_flag(extra_c)]


def _check_pch(gxx_flags: list[str]) -> list[str]:
    """`-I` the trusted store's precompiled torch header made under exactly these flags, where
    there is one (`KLOOP_PCH_ROOT`, as for `load_inline` builds: `evaluator.build.cxx_pch`)."""
    root = os.environ.get(cxx_pch.ROOT_ENV)
    if not root:
        return []
    entry = Path(root) / cxx_pch.pch_key(CHECK_CXX, gxx_flags)
    return ["-I", str(entry)] if (entry / cxx_pch.READY).is_file() else []


def _plan(cuda_parts: list[str], cpp_parts: list[str], functions, no_implicit_headers: bool,
          nvcc_flags: list[str], gxx_flags: list[str]) -> _Plan:
    """One nvcc compile of cuda.cu, with the prototypes folded in when that is all cpp_sources
    holds (saves a 30-80 s g++ pass over torch/extension.h); otherwise a parallel g++ check of
    main.cpp as load_inline writes it."""
    cuda_prefix = [] if no_implicit_headers else CUDA_IMPLICIT_HEADERS
    fold = not no_implicit_headers and _prototypes_only(cpp_parts)
    cuda_map = [("cuda_sources", p) for p in cuda_parts]
    if fold:
        cuda_map += [("cpp_sources", p) for p in cpp_parts]
        probes = _binding_probes(functions)
        if probes:
            cuda_map.append(("functions", "\n".join(probes)))
    files = {"cuda.cu": "\n".join(cuda_prefix + [t for _, t in cuda_map])}
    cmds = [["nvcc", *nvcc_flags, "-cubin", "-Xptxas", "-v", "cuda.cu", "-o", "cuda.cubin"]]
    maps = {"cuda.cu": cuda_map}
    prefix = {"cuda.cu": len(cuda_prefix)}
    if not fold:
        cpp_prefix = [] if no_implicit_headers else CPP_IMPLICIT_HEADERS
        files["main.cpp"] = "\n".join(cpp_prefix + cpp_parts + binding_lines(functions))
        cmds.append([CHECK_CXX, *gxx_flags, "-fsyntax-only", "main.cpp"])
        maps["main.cpp"] = [("cpp_sources", p) for p in cpp_parts]
        prefix["main.cpp"] = len(cpp_prefix)
    return _Plan(files=files, cmds=cmds, maps=maps, prefix=prefix)


def nvcc_check(
    cuda_sources: str | Sequence[str],
    cpp_sources: str | Sequence[str] | None,
    extra_cuda_cflags: Sequence[str] | None,
    work_dir: Path,
    arch: str = "sm_90",
    timeout_s: float = 300.0,
    *,
    functions: str | Sequence[str] | dict[str, str] | None = None,
    extra_cflags: Sequence[str] | None = None,
    extra_include_dirs: Sequence[str] = (),
    no_implicit_headers: bool = False,
    candidate_source: str | None = None,
    candidate_name: str | None = None,
    cache_dir: Path | None = None,
) -> CompileLog:
    """Compile-check the sources of a `load_inline` CUDA extension for `arch` without building it.

    Checks what load_inline would compile (see `_plan`) and returns a CompileLog whose diagnostics
    point into the candidate file when `candidate_source`/`candidate_name` are given. The
    compiler output is cached by content hash under `cache_dir` (default: $KLOOP_NVCC_CHECK_CACHE
    or ~/.cache/kloop/nvcc_check). `infra_error` is set (and `ok` False) when the check could not
    finish for reasons that are not the candidate's fault.
    """
    target = arch if arch.startswith("sm_") else f"sm_{arch.replace('.', '')}"
    if shutil.which("nvcc") is None:
        return CompileLog(backend="cuda", ok=False, target=target,
                          infra_error="nvcc is not installed on this machine")
    work_dir.mkdir(parents=True, exist_ok=True)
    extra_cuda, extra_c = without_arch_flags(extra_cuda_cflags or []), list(extra_cflags or [])
    common = _common_flags(extra_include_dirs)
    gxx = check_gxx_flags(extra_c, extra_include_dirs)
    plan = _plan(
        as_list(cuda_sources), as_list(cpp_sources), functions, no_implicit_headers,
        [*common, *_NVCC_DEFAULT_FLAGS, *extra_cuda, *_std_flag(extra_cuda), f"-arch={target}"],
        gxx,
    )
    for name, text in plan.files.items():
        (work_dir / name).write_text(text)
    key = hashlib.sha256(
        json.dumps([plan.files, plan.cmds, _toolchain_id()]).encode()
    ).hexdigest()
    # The precompiled header changes how long g++ takes, never what it says (it takes the PCH
    # only where valid): one key with or without it.
    pch_args = _check_pch(gxx)
    cmds = [[c[0], *pch_args, *c[1:]] if c[0] == CHECK_CXX else c for c in plan.cmds]
    raw, hit = _cached_run(key, _cache_dir(cache_dir),
                           lambda: _run_parallel(cmds, work_dir, timeout_s))

    smaps = {
        name: build_source_map(name, plan.prefix[name], parts, candidate_source, candidate_name)
        for name, parts in plan.maps.items()
    }
    infra = None
    if raw.timed_out:
        infra = f"compile check exceeded {timeout_s:.0f} s"
    elif (header := _missing_infra_header(raw.output)) is not None:
        infra = f"SDK header {header} is not installed on this machine; the check is incomplete"
    undeclared = _undeclared(functions, as_list(cpp_sources), candidate_source,
                             candidate_name) if "main.cpp" not in plan.files else []
    ok = infra is None and not undeclared and all(rc == 0 for rc in raw.returncodes)
    diagnostics = [] if infra else undeclared + _explain_probes(
        parse_nvcc_log(raw.output, smaps), functions)
    return make_compile_log(
        "cuda", ok, raw.output, diagnostics, work_dir / "compile.log",
        infra_error=infra, cache_hit=hit, target=target,
        resources=parse_ptxas_verbose(raw.output) if ok else [],
        seconds=0.0 if hit else raw.seconds,
    )
