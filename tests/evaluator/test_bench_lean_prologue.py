"""bench/lean_prologue.py's parts that decide what it compares: the headers outside torch that
`<torch/types.h>` includes (the preprocessor's own include tree, under torch's nvcc flags) and
the device-code comparison it reports (the compiles themselves are the bench's, ~25 s here)."""

from __future__ import annotations

import importlib.util
import shutil
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
spec = importlib.util.spec_from_file_location("lean_prologue", REPO / "bench" / "lean_prologue.py")
lean = importlib.util.module_from_spec(spec)
spec.loader.exec_module(lean)


@pytest.mark.parametrize("path, name", [
    ("/usr/include/c++/12/vector", "vector"),
    ("/usr/include/c++/12/bits/stl_vector.h", "bits/stl_vector.h"),
    ("/usr/lib/gcc/x86_64-linux-gnu/12/include/x86intrin.h", "x86intrin.h"),
    ("/usr/local/cuda-13.0/targets/x86_64-linux/include/cuda_fp16.h", "cuda_fp16.h"),
    ("/usr/local/cuda-13.0/targets/x86_64-linux/include/cccl/thrust/complex.h", "thrust/complex.h"),
    ("/usr/include/stdio.h", "stdio.h"),
    ("/opt/elsewhere/foo.h", None),
])
def test_a_found_header_is_named_as_an_include_would_name_it(path, name):
    assert lean._include_name(path) == name


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs nvcc")
def test_the_headers_torch_types_pulls_in_are_the_standard_and_cuda_ones(tmp_path):
    names = lean.boundary_headers(shutil.which("nvcc"), lean.torch_flags("90"), tmp_path)
    assert len(names) == len(set(names))
    assert {"vector", "cmath", "algorithm", "cuda_fp16.h"} <= set(names), names
    # Only what a torch header includes directly: no libstdc++ internals, nothing of torch.
    assert not [n for n in names if n.startswith(("bits/", "torch/", "ATen/", "c10/"))], names
