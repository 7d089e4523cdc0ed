"""The ghost trial's stub for Triton launches that skip the JIT entry (a kept `CompiledKernel`,
or its launcher held on its own: exploit K7, honest H46): turned into no-ops for the kernels
named, by the name the driver gives the function handle; every other launch runs."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest
import torch
from kloop.evaluator.worker.probes import _launcher_class, function_name, ghost_compiled_launches

KERNELS = '''
import triton
import triton.language as tl


@triton.jit
def fill_a(out_ptr, value, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(out_ptr + offs, tl.full((BLOCK,), value, tl.float32), mask=offs < n)


@triton.jit
def fill_b(out_ptr, value, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(out_ptr + offs, tl.full((BLOCK,), value, tl.float32), mask=offs < n)
'''


def _kernels(tmp_path: Path):
    path = tmp_path / "kloop_ghost_kernels.py"  # @triton.jit reads its source from a file
    path.write_text(KERNELS)
    spec = importlib.util.spec_from_file_location("kloop_ghost_kernels", path)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


def test_where_triton_has_no_gpu_driver_nothing_is_patched():
    """The CPU host (and the interpreter): no launcher class to patch, no driver to name a
    handle; the stub context changes nothing and counts nothing."""
    if torch.cuda.is_available():
        pytest.skip("a host without a GPU")
    import triton  # noqa: F401  (the context looks for it in sys.modules)

    assert _launcher_class() is None
    assert function_name(0x1234) is None
    with ghost_compiled_launches({"fill_a"}) as seen:
        pass
    assert seen.count == 0


@pytest.mark.gpu
def test_kept_compiled_kernels_of_the_named_kernels_launch_nothing(tmp_path):
    k = _kernels(tmp_path)
    n, block = 4096, 1024
    grid = (n // block, 1, 1)
    x = torch.zeros(n, device="cuda")
    y = torch.zeros(n, device="cuda")
    kept_a = k.fill_a[grid[:1]](x, 1.0, n, BLOCK=block)  # the JIT launch returns the kernel
    kept_b = k.fill_b[grid[:1]](y, 1.0, n, BLOCK=block)
    torch.cuda.synchronize()
    assert function_name(kept_a.function) == "fill_a"
    assert function_name(kept_b.function) == "fill_b"
    x.zero_()
    y.zero_()
    stream = torch.cuda.current_stream().cuda_stream
    launcher = kept_a.run  # the launcher, held on its own

    with ghost_compiled_launches({"fill_a"}) as seen:
        kept_a[grid](x, 2.0, n, block)
        launcher(*grid, stream, kept_a.function, kept_a.packed_metadata, None, None, None,
                 x, 3.0, n, block)
        kept_b[grid](y, 4.0, n, block)  # not named: runs
        torch.cuda.synchronize()
    assert seen.count == 2
    assert torch.count_nonzero(x).item() == 0
    assert torch.all(y == 4.0).item()

    kept_a[grid](x, 5.0, n, block)  # the launcher is itself again
    torch.cuda.synchronize()
    assert torch.all(x == 5.0).item()
