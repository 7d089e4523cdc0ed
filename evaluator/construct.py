"""Building models and inputs the KernelBench way, identically in the reference and candidate
processes (runs inside children only).

Construction: `torch.manual_seed(42)`, `get_init_inputs()`, `torch.manual_seed(42)`, the model
class called on CPU under `no_grad`, then moved to the device and precision. Models stay in
training mode (KernelBench never calls `.eval()`; BatchNorm uses batch statistics).
"""

from __future__ import annotations

import hashlib
import math
import platform
import socket
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import torch

from evaluator.protocol import ProblemSpec
from evaluator.result import EnvInfo
from problems.registry import load_module

CONSTRUCTION_SEED = 42
_DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}


def apply_numerics(allow_tf32: bool | None) -> None:
    """Fix TF32 before anything is built; None keeps PyTorch's defaults."""
    if allow_tf32 is None:
        return
    torch.backends.cuda.matmul.allow_tf32 = allow_tf32
    torch.backends.cudnn.allow_tf32 = allow_tf32


def load_problem(spec: ProblemSpec) -> ModuleType:
    return load_module(Path(spec.path), spec.overrides)


def _place(x: Any, spec: ProblemSpec) -> Any:
    if not isinstance(x, torch.Tensor):
        return x
    if x.is_floating_point():
        return x.to(device=spec.device, dtype=_DTYPES[spec.precision])
    return x.to(device=spec.device)


def init_inputs(problem: ModuleType, spec: ProblemSpec) -> list[Any]:
    torch.manual_seed(CONSTRUCTION_SEED)
    return [_place(x, spec) for x in problem.get_init_inputs()]


def construct(cls: type, init: list[Any], spec: ProblemSpec) -> torch.nn.Module:
    """Seed 42, build on CPU without autograd, then move to the device and precision."""
    torch.manual_seed(CONSTRUCTION_SEED)
    with torch.no_grad():
        model = cls(*init)
    return model.to(device=spec.device, dtype=_DTYPES[spec.precision])


def draw_inputs(problem: ModuleType, seed: int, spec: ProblemSpec) -> list[Any]:
    """`get_inputs()` after seeding with `seed`, placed on the device in the run precision."""
    torch.manual_seed(seed)
    return [_place(x, spec) for x in problem.get_inputs()]


def scaled_inputs(inputs: list[Any], seed: int, scale: float) -> list[Any]:
    """Floating inputs replaced by `scale` * standard-normal draws of the same shape: signs and
    magnitudes `get_inputs()` never produces (the probe trial of some degenerate problems)."""
    gen = torch.Generator().manual_seed(seed)
    out = []
    for x in inputs:
        if isinstance(x, torch.Tensor) and x.is_floating_point():
            draw = torch.randn(x.shape, generator=gen, dtype=torch.float32) * scale
            x = draw.to(device=x.device, dtype=x.dtype)
        out.append(x)
    return out


def parameter_layout(model: torch.nn.Module) -> list[list[Any]]:
    """[name, shape] of every parameter, sorted by name."""
    return sorted([name, list(p.shape)] for name, p in model.named_parameters())


def perturb_parameters(model: torch.nn.Module, seed: int) -> None:
    """Move every floating parameter by half its own standard deviation (0.05 for constant ones:
    BatchNorm's ones and zeros) times seeded normal noise, computed on CPU in float32 so that
    the reference and the candidate, given equal parameters, get bitwise-equal ones. Buffers
    are left alone."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if not p.is_floating_point():
                continue
            digest = hashlib.sha256(f"{seed}:{name}".encode()).digest()
            gen = torch.Generator().manual_seed(int.from_bytes(digest[:8], "big") >> 1)
            base = p.detach().to("cpu", torch.float32)
            std = float(base.std()) if base.numel() > 1 else 0.0
            spread = 0.5 * std if math.isfinite(std) and std > 0 else 0.05
            noise = torch.randn(base.shape, generator=gen, dtype=torch.float32) * spread
            p.copy_((base + noise).to(device=p.device, dtype=p.dtype))


def to_device(inputs: list[Any], device: str) -> list[Any]:
    return [x.to(device) if isinstance(x, torch.Tensor) else x for x in inputs]


def clone_all(inputs: list[Any]) -> list[Any]:
    return [x.clone() if isinstance(x, torch.Tensor) else x for x in inputs]


def as_output_list(out: Any) -> list[Any]:
    """A model's return value as a list (a tuple or list of outputs, or one output)."""
    return list(out) if isinstance(out, (tuple, list)) else [out]


def sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def env_info(device: str) -> EnvInfo:
    try:
        import triton

        triton_version: str | None = triton.__version__
    except ImportError:
        triton_version = None
    name, arch, driver = _cpu_name(), None, None
    if device == "cuda":
        props = torch.cuda.get_device_properties(0)
        name, arch = props.name, f"sm_{props.major}{props.minor}"
        driver = _driver_version()
    return EnvInfo(
        python=sys.version.split()[0], torch=torch.__version__, triton=triton_version,
        cuda=torch.version.cuda, device_name=name, gpu_arch=arch, driver=driver,
        hostname=socket.gethostname(),
    )


def _cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return "cpu: " + line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "cpu: " + (platform.processor() or platform.machine())


def _driver_version() -> str | None:
    try:
        import ctypes

        lib = ctypes.CDLL("libcuda.so.1")
        v = ctypes.c_int()
        if lib.cuDriverGetVersion(ctypes.byref(v)) == 0:
            return f"{v.value // 1000}.{(v.value % 1000) // 10}"
    except OSError:
        pass
    return None
