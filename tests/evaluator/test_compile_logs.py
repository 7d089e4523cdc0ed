"""Compiler-log parsing: nvcc/gcc/ptxas/ld formats, noise, dedup, mapping into the candidate."""

from __future__ import annotations

import ast
import shutil
from pathlib import Path

import pytest
from kloop.evaluator.build.diagnostics import (
    LOG_TAIL_BYTES,
    build_source_map,
    diagnostic_from_exception,
    make_compile_log,
    parse_nvcc_log,
)
from kloop.evaluator.common.resources import parse_ptxas_verbose

FIXTURES = Path(__file__).parent / "fixtures_e2"
BUILD = "/root/.cache/torch_extensions/py311_cu130/add_ext"

# Written by hand in the shape of a failed load_inline build (torch prefixes ninja's output).
NINJA_LOG = f"""Error building extension 'add_ext': [1/3] /usr/local/cuda/bin/nvcc \
--generate-dependencies-with-compile -DTORCH_EXTENSION_NAME=add_ext -c {BUILD}/cuda.cu -o cuda.cuda.o
FAILED: cuda.cuda.o
/usr/local/cuda/bin/nvcc -DTORCH_EXTENSION_NAME=add_ext -c {BUILD}/cuda.cu -o cuda.cuda.o
{BUILD}/cuda.cu(7): error: identifier "scale" is undefined
      if (i < n) out[i] = a[i] + b[i] * scale;
                                        ^

{BUILD}/cuda.cu(12): error: no suitable conversion function from "at::Tensor" to "int" exists
      int n = a;
              ^

{BUILD}/cuda.cu(7): error: identifier "scale" is undefined
          detected during instantiation of "void add_kernel<T>(const T *, const T *, T *, int) \
[with T=float]" at line 14

{BUILD}/cuda.cu(9): warning #177-D: variable "unused" was declared but never referenced
      int unused;
          ^

Remark: The warnings can be suppressed with "-diag-suppress <warning-number>"

/usr/lib/python3/site-packages/torch/include/ATen/core/TensorBody.h(245): warning #20012-D: \
__host__ annotation is ignored
/usr/lib/python3/site-packages/torch/include/ATen/core/TensorBody.h(301): error: no instance \
of overloaded function "at::Tensor::data_ptr" matches the argument list

3 errors detected in the compilation of "{BUILD}/cuda.cu".
[2/3] c++ -MMD -MF main.o.d -DTORCH_EXTENSION_NAME=add_ext -c {BUILD}/main.cpp -o main.o
FAILED: main.o
c++ -MMD -MF main.o.d -c {BUILD}/main.cpp -o main.o
In file included from {BUILD}/main.cpp:1:
{BUILD}/main.cpp:2:1: error: 'Tensr' does not name a type
    2 | Tensr add_cuda(torch::Tensor a, torch::Tensor b);
      | ^~~~~
{BUILD}/main.cpp:4:5: note: in expansion of macro 'PYBIND11_MODULE'
ninja: build stopped: subcommand failed.
"""


def _strings(source: str) -> dict[str, str]:
    out = {}
    for node in ast.parse(source).body:
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant):
            out[node.targets[0].id] = node.value.value
    return out


@pytest.fixture
def broken_maps():
    source = (FIXTURES / "cuda_add_broken.py").read_text()
    s = _strings(source)
    return {
        "cuda.cu": build_source_map("cuda.cu", 3, [("cuda_sources", s["cuda_source"])],
                                    source, "candidate.py"),
        "main.cpp": build_source_map("main.cpp", 1, [("cpp_sources", s["cpp_source"])],
                                     source, "candidate.py"),
    }


def test_ninja_log_becomes_deduplicated_diagnostics_in_the_candidate(broken_maps):
    diags = parse_nvcc_log(NINJA_LOG, broken_maps)
    by_msg = {d.message.split(" [")[0]: d for d in diags}
    # cuda.cu line 7 is line 4 of the string, which starts on candidate line 5.
    scale = by_msg['identifier "scale" is undefined']
    assert (scale.file, scale.line, scale.count, scale.severity) == ("candidate.py", 8, 2, "error")
    assert scale.message.endswith("[cuda.cu:7]")
    conv = by_msg['no suitable conversion function from "at::Tensor" to "int" exists']
    assert (conv.file, conv.line) == ("candidate.py", 13)
    # the candidate's own warning is kept; warnings inside torch headers are dropped
    unused = by_msg['variable "unused" was declared but never referenced']
    assert (unused.severity, unused.line) == ("warning", 10)
    assert not any("__host__ annotation" in d.message for d in diags)
    header = by_msg['no instance of overloaded function "at::Tensor::data_ptr" matches the '
                    'argument list']
    assert header.file == "ATen/core/TensorBody.h" and header.line == 301
    # g++ error in main.cpp line 2 = first line of cpp_source (candidate line 20)
    tensr = by_msg["'Tensr' does not name a type"]
    assert (tensr.file, tensr.line, tensr.column) == ("candidate.py", 20, 1)
    # ninja progress, FAILED:, command lines, notes, remarks and summaries are all gone
    assert len(diags) == 5
    assert not any("ninja" in d.message or "FAILED" in d.message or "note" in d.message
                   for d in diags)


def test_lines_of_implicit_headers_stay_in_the_generated_file(broken_maps):
    diags = parse_nvcc_log(f"{BUILD}/cuda.cu(2): error: cannot open source file \"cuda.h\"",
                           broken_maps)
    assert [(d.file, d.line) for d in diags] == [("cuda.cu", 2)]


def test_string_not_found_in_candidate_maps_to_the_string_line():
    smap = build_source_map("cuda.cu", 3, [("cuda_sources", "a\nb\nc")], "x = 1\n", "cand.py")
    [d] = parse_nvcc_log("cuda.cu(5): error: bad thing", {"cuda.cu": smap})
    assert (d.file, d.line) == ("cuda_sources", 2)


def test_locationless_diagnostics():
    log = """ptxas error   : Entry function '_Z6kernelPf' uses too much shared data (0x30000 bytes, 0xc000 max)
nvcc fatal   : Unsupported gpu architecture 'sm_70'
/usr/bin/ld: cannot find -lcublasLt: No such file or directory
ImportError: /tmp/b/add_ext.so: undefined symbol: _Z8add_cudaN2at6TensorES0_
collect2: error: ld returned 1 exit status
"""
    msgs = [d.message for d in parse_nvcc_log(log)]
    assert msgs[0].startswith("Entry function '_Z6kernelPf' uses too much shared data")
    assert msgs[1] == "Unsupported gpu architecture 'sm_70'"
    assert msgs[2] == "cannot find -lcublasLt: No such file or directory"
    if shutil.which("c++filt"):
        assert "add_cuda(at::Tensor, at::Tensor)" in msgs[3]
    assert "cpp_sources" in msgs[3]


def test_ptxas_verbose_resources():
    log = """ptxas info    : 0 bytes gmem
ptxas info    : Compiling entry function '_Z10add_kernelPKfS0_Pfi' for 'sm_90'
ptxas info    : Function properties for _Z10add_kernelPKfS0_Pfi
    0 bytes stack frame, 8 bytes spill stores, 8 bytes spill loads
ptxas info    : Used 40 registers, used 1 barriers, 1024 bytes smem, 380 bytes cmem[0]
ptxas info    : Compiling entry function 'tiny' for 'sm_90'
ptxas info    : Used 6 registers, used 0 barriers, 380 bytes cmem[0]
"""
    res = {r.kernel: r for r in parse_ptxas_verbose(log)}
    expected_add = "add_kernel" if shutil.which("c++filt") else "_Z10add_kernelPKfS0_Pfi"
    add = res[expected_add]
    assert (add.registers, add.spill_bytes, add.shared_bytes) == (40, 8, 1024)
    assert (res["tiny"].registers, res["tiny"].shared_bytes) == (6, 0)


def test_syntax_error_diagnostic(tmp_path):
    path = tmp_path / "candidate.py"
    path.write_text("import torch\n\ndef f(:\n    pass\n")
    with pytest.raises(SyntaxError) as info:
        compile(path.read_text(), str(path), "exec")
    d = diagnostic_from_exception(info.value, path)
    assert (d.file, d.line) == ("candidate.py", 3)
    assert d.message.startswith("SyntaxError:")


def test_other_exception_points_at_the_deepest_candidate_frame(tmp_path):
    path = tmp_path / "candidate.py"
    path.write_text("def helper():\n    raise ValueError('bad block size')\n\nhelper()\n")
    with pytest.raises(ValueError) as info:
        exec(compile(path.read_text(), str(path), "exec"), {})
    d = diagnostic_from_exception(info.value, path)
    assert (d.file, d.line, d.message) == ("candidate.py", 2, "ValueError: bad block size")


def test_compile_log_keeps_a_tail_and_writes_the_full_log(tmp_path):
    text = "".join(f"line {i}\n" for i in range(5000))
    log = make_compile_log("cuda", False, text, [], tmp_path / "logs" / "build.log")
    assert len(log.log_tail.encode()) <= LOG_TAIL_BYTES
    assert log.log_tail.endswith("line 4999\n")
    assert Path(log.log_path).read_text() == text


def test_candidate_arch_flags_are_dropped_for_the_check():
    from kloop.evaluator.build.nvcc import without_arch_flags

    flags = ["-O3", "-arch=sm_80", "--use_fast_math", "-gencode", "arch=compute_90,code=sm_90",
             "-gencode=arch=compute_80,code=sm_80", "-lineinfo"]
    assert without_arch_flags(flags) == ["-O3", "--use_fast_math", "-lineinfo"]


def test_bound_function_missing_from_cpp_sources_is_reported():
    from kloop.evaluator.build.nvcc import _undeclared

    cpp = "torch::Tensor fwd(torch::Tensor x);  // bwd( is only mentioned in a comment"
    cand = f'CPP = "{cpp}"\n'
    diags = _undeclared(["fwd", "bwd"], [cpp], cand, "candidate.py")
    assert [(d.file, d.line) for d in diags] == [("candidate.py", 1)]
    assert diags[0].message.startswith("'bwd' was not declared")
