"""The lean build of a `load_inline` `.cu` (evaluator.build.lean, through nvcc_parallel): which
texts qualify, and that a qualifying file builds to the same device code as the plain way while
one that fails lean is built the plain way. Compile only (nvcc, torch's headers; no GPU)."""

from __future__ import annotations

import ast
import importlib.util
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from kloop.evaluator.build import lean, nvcc_parallel

pytestmark = pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs nvcc")

KERNEL = r"""
__global__ void relu_kernel(const float* __restrict__ x, float* __restrict__ y, long n) {
    long i = (long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = fmaxf(x[i], 0.0f);  // no torch here: "at::Tensor" is only text
}
void relu_launch(const float* x, float* y, long n, cudaStream_t stream) {
    relu_kernel<<<(unsigned)((n + 255) / 256), 256, 0, stream>>>(x, y, n);
}
"""
# Includes of headers torch's and the lean prologue both made already (no-ops after either).
WARNS = ("#include <cfloat>\n#include <math.h>\n" + KERNEL
         + "__global__ void w(float* p) { int unused = 3; p[0] = FLT_MAX; }\n")
# Tensor cores through <mma.h>, a header neither prologue makes (`lean.extra_refusal`).
WMMA = r"""
#include <mma.h>
using namespace nvcuda;
__global__ void tile16(const half* a, const half* b, float* c) {
    wmma::fragment<wmma::matrix_a, 16, 16, 16, half, wmma::row_major> fa;
    wmma::fragment<wmma::matrix_b, 16, 16, 16, half, wmma::col_major> fb;
    wmma::fragment<wmma::accumulator, 16, 16, 16, float> fc;
    wmma::fill_fragment(fc, 0.0f);
    wmma::load_matrix_sync(fa, a, 16);
    wmma::load_matrix_sync(fb, b, 16);
    wmma::mma_sync(fc, fa, fb, fc);
    wmma::store_matrix_sync(c, fc, 16, wmma::mem_row_major);
}
"""
# Qualifies by its text and fails to compile: the lean attempt is dropped, the plain one speaks.
BROKEN = KERNEL + "__global__ void b(float* p) { p[0] = undeclared_thing; }\n"


def _flags() -> list[str]:
    return lean.torch_nvcc_flags()


@pytest.fixture(scope="module")
def facts(tmp_path_factory) -> lean.Facts:
    work = tmp_path_factory.mktemp("facts")
    found = lean.facts(shutil.which("nvcc"), [*_flags(), "-c", "x.cu", "-o", "x.o"], "x.cu", work)
    assert found is not None
    return found


def test_the_prologue_is_what_torch_includes_from_outside_torch(facts):
    assert {"vector", "cmath", "cuda_fp16.h"} <= set(facts.headers), facts.headers
    assert not [h for h in facts.headers if h.startswith(("bits/", "torch/", "ATen/", "c10/"))]
    # Torch's header defines macros without a torch prefix; a text naming them never qualifies.
    assert {"CHECK", "CUDA_KERNEL_ASSERT"} <= facts.torch_macros


@pytest.mark.parametrize("path, name", [
    ("/usr/include/c++/12/vector", "vector"),
    ("/usr/lib/gcc/x86_64-linux-gnu/12/include/x86intrin.h", "x86intrin.h"),
    ("/usr/local/cuda-13.0/targets/x86_64-linux/include/cuda_fp16.h", "cuda_fp16.h"),
    ("/usr/local/cuda-13.0/targets/x86_64-linux/include/cccl/thrust/complex.h", "thrust/complex.h"),
    ("/usr/include/stdio.h", "stdio.h"),
    ("/opt/elsewhere/foo.h", None),
])
def test_a_found_header_is_named_as_an_include_would_name_it(path, name):
    assert lean.include_name(path) == name


@pytest.mark.parametrize("text, why", [
    (KERNEL, None),
    ("#include <vector>\n#include <cuda_runtime.h>\n" + KERNEL, None),
    ("// torch::Tensor in a comment\n/* c10 */ int x;\n", None),
    ("#include <torch/extension.h>\n" + KERNEL, "includes <torch/extension.h>"),
    ('#include "my.h"\n', 'includes "my.h"'),
    # Without the preprocessor's word (`extra_refusal`) only the prologue's own headers pass.
    ("#include <cfloat>\n" + KERNEL, "includes <cfloat>"),
    ("#include <mma.h>\n", "includes <mma.h>"),
    ("#define H <mma.h>\n#include H\n", "`#include H`"),
    ("#include_next <cmath>\n", "`#include_next <cmath>`"),
    ("torch::Tensor f(torch::Tensor x);\n", "`torch`"),
    ("int g(at::Tensor t);\n", "`at`"),
    ("#define CHECK(x) x\n", "`CHECK`, a macro"),
    ("int a = AT_CUDA_CHECK_X;\n", "`AT_CUDA_CHECK_X`"),
])
def test_only_a_text_that_uses_nothing_of_torch_qualifies(facts, text, why):
    got = lean.refusal(text, facts)
    assert (got is None) if why is None else (got is not None and why in got), got


ROOT = Path(__file__).resolve().parents[2]


def _cuda_sources(code: str) -> str:
    """The `cuda_sources` string a file's `load_inline` call passes (a literal or a module-level
    name bound to one)."""
    tree = ast.parse(code)
    names = {t.id: n.value.value for n in tree.body if isinstance(n, ast.Assign)
             for t in n.targets if isinstance(t, ast.Name) and isinstance(n.value, ast.Constant)}
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "load_inline":
            arg = next(k.value for k in node.keywords if k.arg == "cuda_sources")
            return arg.value if isinstance(arg, ast.Constant) else names[arg.id]
    raise AssertionError("no load_inline call")


def _prompt_example() -> str:
    text = (ROOT / "prompts" / "_example_cuda.j2").read_text()
    return text.split("```python\n", 1)[1].split("```", 1)[0]


@pytest.mark.parametrize("where", [
    "prompt example", "tests/evaluator/candidates/mlp_cuda_relu_lean.py",
    "tests/evaluator/candidates/attention_cuda_lean.py",
    "tests/evaluator/candidates/resnet_block_bn_relu_cuda_lean.py",
    "tests/exploits/honest/h48_minigpt_lean_cg_softmax.py"])
def test_the_prompts_example_and_the_lean_candidates_qualify(facts, where, tmp_path):
    """What the CUDA prompt shows the model, and the candidates written that way, build lean:
    a prompt edit that put torch back into the `.cu` would cost every build ~30 s."""
    code = _prompt_example() if where == "prompt example" else (ROOT / where).read_text()
    assert lean.refusal(_cuda_sources(code), facts,
                        lambda names: _extra(facts, names, tmp_path)) is None


def _extra(facts, names: list[str], work: Path, include_dir: Path | None = None) -> str | None:
    args = [*_flags(), *([f"-I{include_dir}"] if include_dir else []), "-c", "x.cu", "-o", "x.o"]
    return lean.extra_refusal(shutil.which("nvcc"), args, "x.cu", facts, names, work)


def test_headers_torch_never_opens_qualify_unless_they_name_its_macros_or_it_read_them(
        facts, tmp_path):
    """A header outside both prologues (`<mma.h>`, `<cooperative_groups.h>`, `<cub/cub.cuh>`)
    is read at the candidate's line after either prologue, to the same text, unless torch's
    header opened one of its files already (then only the lean build would read it there) or
    its text names a macro only torch's header defines."""
    assert _extra(facts, ["mma.h", "cooperative_groups.h"], tmp_path) is None
    assert _extra(facts, ["cub/cub.cuh"], tmp_path) is None
    # Read by both prologues already (skipped after either), as are the prologue's own.
    assert _extra(facts, ["cfloat", "math.h", "unordered_map", "vector", "utility",
                          "type_traits", "cstdio", "limits"], tmp_path) is None
    text = "#include <cfloat>\n#include <unordered_map>\n#include <mma.h>\n" + KERNEL
    assert lean.refusal(text, facts, lambda names: _extra(facts, names, tmp_path)) is None
    why = _extra(facts, ["c10/macros/Macros.h"], tmp_path)
    assert why is not None and "read already by torch's header only" in why, why
    mine = tmp_path / "inc"
    mine.mkdir()
    (mine / "uses_check.h").write_text("#pragma once\n// CHECK in a comment is fine\n"
                                       "#ifndef CHECK\n#define MY_ASSERT(x) x\n#endif\n")
    (mine / "plain.h").write_text("#pragma once\n/* CHECK */ inline int two() { return 2; }\n")
    why = _extra(facts, ["uses_check.h"], tmp_path, mine)
    assert why is not None and "names `CHECK`" in why, why
    assert _extra(facts, ["plain.h"], tmp_path, mine) is None
    assert "does not preprocess" in _extra(facts, ["no_such_header.h"], tmp_path)
    # One the lean prologue reads and torch's header would not: the lean build would skip it
    # at the candidate's line where the plain build reads it there.
    cfloat = next(p for p in facts.lean_paths if lean.include_name(p) == "cfloat")
    lean_only = facts._replace(plain_paths=facts.plain_paths - {cfloat})
    why = _extra(lean_only, ["cfloat"], tmp_path)
    assert why is not None and "read already by the lean prologue only" in why, why


def _build(work: Path, body: str, lean_on: bool, flags: list[str] | None = None
           ) -> tuple[subprocess.CompletedProcess, list[str]]:
    """`body` after `load_inline`'s prologue, compiled by the parallel nvcc into `work/cuda.o`
    under `flags` (torch's, as `lean.torch_nvcc_flags` gives them, by default)."""
    work.mkdir(parents=True)
    src = work / "cuda.cu"
    src.write_text("\n".join(lean.PROLOGUE) + "\n" + body)
    report = work / "report.txt"
    env = {k: v for k, v in os.environ.items() if k != lean.ENV}
    env[nvcc_parallel.REPORT_ENV] = str(report)
    if lean_on:
        env[lean.ENV] = "1"
    r = subprocess.run([sys.executable, str(Path(nvcc_parallel.__file__)),
                        *(_flags() if flags is None else flags), "-c",
                        str(src), "-o", str(work / "cuda.o")], env=env, capture_output=True,
                       text=True)
    return r, report.read_text().splitlines() if report.exists() else []


def _sass(obj: Path) -> list[str]:
    """The device code, as bench/lean_prologue.py compares it."""
    spec = importlib.util.spec_from_file_location(
        "lean_prologue", Path(__file__).resolve().parents[2] / "bench" / "lean_prologue.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    dump = bench.find_cuobjdump(shutil.which("nvcc"))
    assert dump is not None, "no cuobjdump on PATH, beside nvcc, or in Triton"
    return bench.sass(dump, obj)


@pytest.mark.slow
def test_a_qualifying_file_builds_lean_to_the_plain_device_code_and_a_failing_one_plainly(
        tmp_path):
    lean_r, lean_report = _build(tmp_path / "lean", WARNS, lean_on=True)
    assert lean_r.returncode == 0, lean_r.stderr[-2000:]
    assert lean_report == ["lean"]
    # Its warning points into the file load_inline wrote, at the line there (`#line`).
    line = 4 + WARNS.count("\n", 0, WARNS.index("int unused"))
    assert f"{tmp_path / 'lean' / 'cuda.cu'}({line})" in lean_r.stderr, lean_r.stderr
    assert "kloop-lean-" not in lean_r.stderr
    plain_r, plain_report = _build(tmp_path / "plain", WARNS, lean_on=False)
    assert plain_r.returncode == 0 and plain_report == ["split"], plain_report
    lean_code, plain_code = _sass(tmp_path / "lean" / "cuda.o"), _sass(tmp_path / "plain" / "cuda.o")
    assert plain_code and any("FMNMX" in ln for ln in plain_code), plain_code[:20]
    assert lean_code == plain_code
    # A failing lean build is dropped: the plain build runs and its diagnostics are the ones seen.
    r, report = _build(tmp_path / "broken", BROKEN, lean_on=True)
    assert r.returncode != 0
    assert report == ["lean failed: built the plain way", "split"], report
    line = 4 + BROKEN.count("\n", 0, BROKEN.index("undeclared_thing"))
    assert r.stderr.count('"undeclared_thing" is undefined') == 1, r.stderr  # the plain one's
    assert f"{tmp_path / 'broken' / 'cuda.cu'}({line}): error" in r.stderr, r.stderr


@pytest.mark.slow
def test_a_wmma_kernel_with_its_own_header_builds_lean_to_the_plain_device_code(tmp_path):
    lean_r, lean_report = _build(tmp_path / "lean", WMMA, lean_on=True)
    assert lean_r.returncode == 0, lean_r.stderr
    assert lean_report == ["lean"]
    plain_r, _ = _build(tmp_path / "plain", WMMA, lean_on=False)
    assert plain_r.returncode == 0, plain_r.stderr
    lean_code, plain_code = _sass(tmp_path / "lean" / "cuda.o"), _sass(tmp_path / "plain" / "cuda.o")
    assert any("HMMA" in ln for ln in plain_code), plain_code[:20]
    assert lean_code == plain_code

