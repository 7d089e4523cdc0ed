"""nvcc with its host and device chains side by side (evaluator.build.nvcc_parallel): the same
files as plain nvcc, the same diagnostics and exit status, nothing left behind; plain nvcc for
whatever it cannot split. Runs wherever nvcc and gcc are (compile only, no GPU)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from kloop.evaluator.build import nvcc_parallel

pytestmark = pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs nvcc")

WRAPPER = Path(nvcc_parallel.__file__)
ARCH = "-gencode=arch=compute_90,code=sm_90"
SOURCE = """
#include <cuda_runtime.h>
namespace { __device__ float scale = 2.0f; }
template <typename T> __global__ void axpy(T a, const T* x, T* y, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = a * x[i] * scale + y[i];
}
void launch(float a, const float* x, float* y, int n) { axpy<<<(n + 255) / 256, 256>>>(a, x, y, n); }
"""
# Two errors: one in host code, one in device code.
BROKEN = SOURCE + "\nvoid host_only() { undeclared_host(); }\n" \
                  "__global__ void k(float* p) { p[0] = undeclared_device; }\n"
WARNS = SOURCE + "\n__global__ void w(float* p) { int unused = 3; p[0] = 1.f; }\n"


def _compile(tool: list[str], work: Path, source: str, *flags: str) -> subprocess.CompletedProcess:
    work.mkdir(parents=True, exist_ok=True)
    (work / "k.cu").write_text(source)
    (work / "tmp").mkdir(exist_ok=True)
    env = {**os.environ, "TMPDIR": str(work / "tmp")}
    return subprocess.run([*tool, "-c", "-O3", *flags, "k.cu", "-o", "k.o"], cwd=work, env=env,
                          capture_output=True, text=True)


PLAIN = ["nvcc"]
PARALLEL = [sys.executable, str(WRAPPER)]


def _normalised(path: Path) -> str:
    """A kept file with the ids nvcc draws at random on every run replaced."""
    text = path.read_text(errors="replace")
    core = (path.parent / "k.module_id").read_text().strip().lstrip("_")
    # As text, and as the bytes that -rdc (hex) and debug info (decimal) embed.
    for form in (core, ",".join(f"0x{b:02x}" for b in core.encode()),
                 ",".join(str(b) for b in core.encode())):
        text = text.replace(form, "MODULE_ID")
    return re.sub(r"_GLOBAL__N__[0-9a-f]+_", "_GLOBAL__N__ID_", text)


def test_the_commands_split_into_a_host_and_a_device_chain(tmp_path):
    (tmp_path / "k.cu").write_text(SOURCE)
    planned = nvcc_parallel.dryrun("nvcc", ["-c", ARCH, str(tmp_path / "k.cu"), "-o", "k.o"])
    assert planned is not None
    parts = nvcc_parallel.split(planned.commands)
    assert parts is not None
    host, device, rest, id_file = parts
    assert "cudafe++" in host[1] and "--gen_module_id_file" not in host[1]
    assert any("cicc" in c for c in device) and any("ptxas" in c for c in device)
    assert id_file in host[1] and any(id_file in c for c in device)
    assert "-c" in rest[-1] and "cudafe1.cpp" in rest[-1]
    # Two architectures: nvcc's own order (its --threads works across architectures).
    two = nvcc_parallel.dryrun("nvcc", ["-c", ARCH, "-gencode=arch=compute_80,code=sm_80",
                                        str(tmp_path / "k.cu"), "-o", "k.o"])
    assert two is not None and nvcc_parallel.split(two.commands) is None


@pytest.mark.parametrize("flags", [
    [ARCH],
    ["-gencode=arch=compute_90,code=[sm_90,compute_90]"],  # TORCH_CUDA_ARCH_LIST="9.0+PTX"
    ["-rdc=true", "-G", "-lineinfo", ARCH],
    ["--use_fast_math", "-Xptxas", "-v", "-DSCALE=3", ARCH],
], ids=["sm90", "sm90+ptx", "rdc-debug", "fast-math-ptxas-v"])
def test_every_file_nvcc_keeps_is_the_same_as_plain_nvccs(tmp_path, flags):
    # One after the other in one directory: debug info names the source's absolute path.
    done = {}
    for label, tool in (("plain", PLAIN), ("parallel", PARALLEL)):
        done[label] = _compile(tool, tmp_path / "work", SOURCE, *flags, "-keep")
        (tmp_path / label).mkdir()
        for kept in (tmp_path / "work").glob("k.*"):
            if kept.name != "k.cu":
                kept.rename(tmp_path / label / kept.name)
    plain, par = done["plain"], done["parallel"]
    assert plain.returncode == par.returncode == 0, par.stderr
    # The same report (ptxas -v's, nvcc's own warnings), but for ptxas's compile time.
    said = [re.sub(r"time = [0-9.]+ ms", "time = T ms", p.stdout + p.stderr) for p in (plain, par)]
    assert said[0] == said[1]
    kept = sorted(p.name for p in (tmp_path / "plain").iterdir() if p.name.startswith("k."))
    assert kept == sorted(p.name for p in (tmp_path / "parallel").iterdir()
                          if p.name.startswith("k."))
    assert {"k.ptx", "k.cudafe1.cpp", "k.cudafe1.stub.c", "k.cpp1.ii", "k.cpp4.ii"} <= set(kept)
    for name in kept:
        if name in ("k.o", "k.cubin", "k.fatbin", "k.fatbin.c", "k.module_id"):
            continue  # binaries that embed the random module id
        assert _normalised(tmp_path / "plain" / name) == \
            _normalised(tmp_path / "parallel" / name), name
    ids = [(tmp_path / d / "k.module_id").read_text().strip() for d in ("plain", "parallel")]
    pattern = re.compile(r"_[0-9a-f]{8}_4_k_cu_[0-9a-f]{8}")
    assert all(pattern.fullmatch(i) for i in ids), ids


def test_diagnostics_and_exit_status_are_plain_nvccs(tmp_path):
    for source, ok in ((BROKEN, False), (WARNS, True)):
        plain = _compile(PLAIN, tmp_path / "plain", source, ARCH)
        par = _compile(PARALLEL, tmp_path / "parallel", source, ARCH)
        assert (plain.returncode == 0) == (par.returncode == 0) == ok
        said = [re.sub(r"tmpxft_[0-9a-f_]+", "TMP", p.stdout + p.stderr) for p in (plain, par)]
        assert said[0] == said[1]
        assert said[0].count("undeclared_host" if not ok else "unused") >= 1
        # Nothing of the run is left in its temporary directory.
        assert not list((tmp_path / "parallel" / "tmp").iterdir())
        if ok:
            assert (tmp_path / "parallel" / "k.o").stat().st_size > 1000


def test_what_it_cannot_split_runs_as_plain_nvcc(tmp_path):
    two = _compile(PARALLEL, tmp_path / "two", SOURCE, ARCH, "-gencode=arch=compute_80,code=sm_80")
    assert two.returncode == 0, two.stderr
    deps = _compile(PARALLEL, tmp_path / "deps", SOURCE, ARCH, "-MD", "-MF", "k.o.d")
    assert deps.returncode == 0, deps.stderr
    assert "k.cu" in (tmp_path / "deps" / "k.o.d").read_text()
    bad = _compile(PARALLEL, tmp_path / "bad", SOURCE, "--no-such-flag")
    assert bad.returncode != 0 and "no-such-flag" in bad.stdout + bad.stderr


def test_it_splits_in_the_environment_compile_children_get(tmp_path):
    """The compile child's scrubbed environment (`sandbox.child_env`) is all a build gets: the
    split still happens there, and each run says what it did."""
    from kloop.evaluator.procs.sandbox import child_env

    (tmp_path / "home" / "tmp").mkdir(parents=True)
    env = child_env(tmp_path / "home", "cpu")
    env[nvcc_parallel.REPORT_ENV] = str(tmp_path / "runs.txt")
    work = tmp_path / "work"
    work.mkdir()
    (work / "k.cu").write_text(SOURCE)
    for extra in ([], ["-gencode=arch=compute_80,code=sm_80"]):
        r = subprocess.run([sys.executable, str(WRAPPER), "--nvcc", shutil.which("nvcc"), "-c",
                            ARCH, *extra, "k.cu", "-o", "k.o"], cwd=work, env=env,
                           capture_output=True, text=True)
        assert r.returncode == 0, r.stderr
    runs = (tmp_path / "runs.txt").read_text().splitlines()
    assert runs == ["split", "plain: not one architecture's host and device chains"]
