"""CPU emulation of GPU-style host code, for running Triton candidates under the interpreter on a
machine without a GPU (candidate child, CPU mode only; the result carries `cpu_emulation`).

Candidates are written for a GPU: they allocate with `device="cuda"`, call `.cuda()` and
`torch.cuda.synchronize()`. A TorchFunctionMode maps every cuda device to cpu and makes
`.cuda()` a no-op, so that host code runs unmodified next to the Triton interpreter.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.overrides import TorchFunctionMode


def _is_cuda(x: Any) -> bool:
    if isinstance(x, str):
        return x == "cuda" or x.startswith("cuda:")
    return isinstance(x, torch.device) and x.type == "cuda"


class CudaOnCpu(TorchFunctionMode):
    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = dict(kwargs or {})
        if func is torch.Tensor.cuda:
            return args[0]
        if _is_cuda(kwargs.get("device")):
            kwargs["device"] = "cpu"
        if func is torch.Tensor.to:
            args = tuple("cpu" if _is_cuda(a) else a for a in args)
        return func(*args, **kwargs)


def _no_op(*args: Any, **kwargs: Any) -> None:
    return None


def install() -> None:
    """Enter the mode for the rest of the process and stub device-wide synchronisation."""
    CudaOnCpu().__enter__()
    torch.cuda.synchronize = _no_op
