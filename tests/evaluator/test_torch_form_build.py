"""A torch-form `.cu` built as two halves through the parallel nvcc (`evaluator.build.torch_form`,
`nvcc_parallel`), as torch's build calls it: one object with the host functions, the launchers
and the kernels, and the kernel's device code the lean build of its own text gives. Compile only
(nvcc and g++ against torch's headers; no GPU). The GPU suite runs the result and compares it
with the plain build (test_gpu_candidates.py)."""

from __future__ import annotations

import shutil
import subprocess
import sysconfig
from pathlib import Path

import pytest
from test_lean_build import _build, _sass

from kloop.evaluator.build import lean, nvcc, nvcc_parallel

pytestmark = pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs nvcc")

TEXT = r"""
#include <torch/extension.h>
#include <cuda_runtime.h>

struct Span { long n; float scale; };

__global__ void scale_relu_kernel(const float* __restrict__ x, float* __restrict__ y, Span s) {
    long i = (long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < s.n) y[i] = fmaxf(x[i], 0.0f) * s.scale;
}

torch::Tensor scale_relu(torch::Tensor x, double scale) {
    TORCH_CHECK(x.scalar_type() == torch::kFloat32, "float32 expected");
    auto xc = x.contiguous();
    auto y = torch::empty_like(xc);
    Span s{xc.numel(), (float)scale};
    scale_relu_kernel<<<(unsigned)((s.n + 255) / 256), 256>>>(
        xc.data_ptr<float>(), y.data_ptr<float>(), s);
    return y;
}
"""


def _torch_args() -> list[str]:
    """The arguments torch's `load_inline` gives its nvcc for `cuda.cu` (its common flags, then
    nvcc's own; the source and output follow), with this host's toolkit headers where a CUDA
    torch would name them."""
    from torch.utils import cpp_extension as ce

    common = ["-DTORCH_EXTENSION_NAME=kloop_tf", "-DTORCH_API_INCLUDE_EXTENSION_H"]
    for p in [*ce.include_paths(), *nvcc._toolkit_include_dirs(),
              sysconfig.get_path("include", scheme="posix_prefix")]:
        common += ["-isystem", p]
    return [*common, *ce.COMMON_NVCC_FLAGS, "-gencode=arch=compute_90,code=sm_90",
            "--compiler-options", "'-fPIC'", "-O3", "-std=c++17"]


def _defined(obj: Path) -> set[str]:
    out = subprocess.run(["nm", "-C", "--defined-only", str(obj)], capture_output=True,
                         text=True, check=True).stdout
    return {line.split(" ", 2)[2] for line in out.splitlines() if line.count(" ") >= 2}


@pytest.mark.slow
def test_a_torch_form_file_builds_as_two_halves_into_one_object(tmp_path):
    r, runs = _build(tmp_path / "split", TEXT, lean_on=True, flags=_torch_args())
    assert r.returncode == 0, r.stderr[-3000:]
    assert runs == ["torch form (host without pch)"], runs
    obj = tmp_path / "split" / "cuda.o"
    names = _defined(obj)
    # The host function the binding calls, the launcher it calls, and the kernel's host stub.
    assert "scale_relu(at::Tensor, double)" in names, sorted(names)
    assert any(n.startswith("kloop_launch_scale_relu_kernel(dim3, dim3, unsigned long, CUstream_st*,"
                            " float const*, float*, Span)") for n in names), sorted(names)
    assert any(n.startswith("scale_relu_kernel(") for n in names), sorted(names)
    undefined = subprocess.run(["nm", "-C", "--undefined-only", str(obj)], capture_output=True,
                               text=True, check=True).stdout
    assert "kloop_launch" not in undefined  # joined inside the object, not left to the link
    # The kernel's device code is the lean build's of the same kernel text (which
    # test_lean_build ties to the plain build's).
    kernel_only = TEXT.split("torch::Tensor scale_relu")[0].replace(
        "#include <torch/extension.h>\n", "")
    r2, runs2 = _build(tmp_path / "lean", kernel_only, lean_on=True, flags=_torch_args())
    assert r2.returncode == 0 and runs2 == ["lean"], (runs2, r2.stderr[-2000:])
    code = _sass(obj)
    assert code and any("FMNMX" in ln for ln in code), code[:20]
    assert code == _sass(tmp_path / "lean" / "cuda.o")


def test_an_attempt_that_cannot_finish_reports_why_and_leaves_the_build_to_the_plain_way(
        tmp_path, monkeypatch):
    """Whatever stops the two halves (here arguments without an output file; on a host, a
    missing `ld`) is a report, never a failed build: the caller builds the plain way."""
    source = tmp_path / "cuda.cu"
    source.write_text("\n".join(lean.PROLOGUE) + "\n" + TEXT)
    report = tmp_path / "report"
    monkeypatch.setenv(nvcc_parallel.REPORT_ENV, str(report))
    assert nvcc_parallel._torch_form(shutil.which("nvcc"), [*_torch_args(), "-c", str(source)],
                                     str(source)) is None
    [line] = report.read_text().splitlines()
    assert line.startswith("torch form failed: ValueError"), line
