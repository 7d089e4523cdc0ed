"""The compile check's precompiled torch header (hosts without a GPU): made by the trusted
builder under the check's own flags, offered to g++ only when complete, taken by g++, and the
check says what it says without it (evaluator/build/pch.py, evaluator/build/nvcc.py)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from kloop.evaluator.build import cxx_pch, nvcc, pch

KERNEL = """
__global__ void twice(float* x, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] *= 2.0f;
}
"""
BINDING = """
#include <c10/cuda/CUDAStream.h>
torch::Tensor twice_op(torch::Tensor x) {
    return x * undeclared_scale;
}
"""


def test_only_a_complete_entry_under_these_flags_is_offered(tmp_path: Path, monkeypatch):
    flags = nvcc.check_gxx_flags()
    entry = tmp_path / cxx_pch.pch_key(nvcc.CHECK_CXX, flags)
    entry.mkdir()
    monkeypatch.delenv(cxx_pch.ROOT_ENV, raising=False)
    assert nvcc._check_pch(flags) == []  # no store named
    monkeypatch.setenv(cxx_pch.ROOT_ENV, str(tmp_path))
    assert nvcc._check_pch(flags) == []  # half made: no ready marker
    (entry / cxx_pch.READY).write_text("")
    assert nvcc._check_pch(flags) == ["-I", str(entry)]
    assert nvcc._check_pch([*flags, "-O3"]) == []  # other flags, another key


@pytest.mark.slow
def test_the_check_takes_its_pch_and_says_what_it_says_without(tmp_path: Path, monkeypatch):
    if nvcc.shutil.which("nvcc") is None:
        pytest.skip("nvcc is not installed")
    monkeypatch.delenv(cxx_pch.ROOT_ENV, raising=False)
    root = pch.store_dir()  # the host's store: what CPU-host evaluations in this run use too
    assert root is not None
    key = pch.build_check(root)
    assert key == pch.check_probe().key and (root / key / cxx_pch.READY).is_file()

    plain = nvcc.nvcc_check(KERNEL, BINDING, None, tmp_path / "plain", cache_dir=tmp_path / "c1")
    monkeypatch.setenv(cxx_pch.ROOT_ENV, str(root))
    taken = nvcc.nvcc_check(KERNEL, BINDING, None, tmp_path / "pch", cache_dir=tmp_path / "c2")
    assert not plain.ok and not taken.ok and not taken.cache_hit
    assert [d.model_dump() for d in taken.diagnostics] == [d.model_dump() for d in plain.diagnostics]
    assert any("undeclared_scale" in d.message for d in taken.diagnostics)

    # g++ marks a precompiled header it took with `!` in its -H list of what it read.
    flags = nvcc.check_gxx_flags()
    r = subprocess.run([nvcc.CHECK_CXX, *flags, *nvcc._check_pch(flags), "-H", "-fsyntax-only",
                        "main.cpp"], cwd=tmp_path / "pch", capture_output=True, text=True)
    assert any(line.startswith("! ") and line.endswith("extension.h.gch")
               for line in r.stderr.splitlines()), r.stderr[-2000:]
