"""Building models and inputs the KernelBench way, identically in the reference and candidate
processes (runs inside children only).

Construction: `torch.manual_seed(42)`, `get_init_inputs()`, `torch.manual_seed(42)`, the model
class called on CPU under `no_grad`, then moved to the device and precision. Models stay in
training mode (KernelBench never calls `.eval()`; BatchNorm uses batch statistics).
"""

from __future__ import annotations

import contextlib
import hashlib
import platform
import socket
import sys
import types
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import torch

from kloop.evaluator.common.protocol import ProblemSpec
from kloop.evaluator.common.result import EnvInfo
from kloop.problems.registry import load_module

CONSTRUCTION_SEED = 42
PREPARE_SHARE = 16
PREPARE_FLOOR, PREPARE_CEILING = 4 << 30, 16 << 30


def prepare_budget(meminfo: str | None = None) -> int:
    """Bytes of second models (the reparam trials') and trials' inputs a child may make on CPU
    before the device lock and hold until it has it: a sixteenth of the memory the host has
    available when the child starts (children that start together each see it all: 8 of them
    take at most half), at least 4 GiB (what it always was) and at most 16. At
    full sizes what does not fit is made under the lock: with 4 GiB, L3/1's 2.7 GB second model
    was built under it in both the reference worker and the candidate child (their holds 6-9 s
    on the H200, 2026-12-03 at 1b2062d). Children of one evaluation do not prepare at once (its
    reference worker is gone before its candidate child starts). `meminfo`: /proc/meminfo's text."""
    from kloop.evaluator.common.linux import available_bytes

    have = available_bytes(meminfo)
    if have is None:
        return PREPARE_FLOOR
    return max(PREPARE_FLOOR, min(PREPARE_CEILING, have // PREPARE_SHARE))
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


def construct(cls: type, init: list[Any], spec: ProblemSpec, fills_out: str | None = None,
              fills_in: str | None = None) -> torch.nn.Module:
    """The evaluation's main model. KernelBench's way (no `construction_seed`): seed 42, build on
    CPU without autograd, then move to the device and precision. Otherwise `noisy_model` under
    the secret construction seed (the reference writes its fills, the candidate reads them)."""
    if spec.construction_seed is not None:
        return noisy_model(cls, init, spec, spec.construction_seed, fills_out, fills_in)
    torch.manual_seed(CONSTRUCTION_SEED)
    with torch.no_grad():
        model = cls(*init)
    return model.to(device=spec.device, dtype=_DTYPES[spec.precision])


def _scaled(x: Any, spec: ProblemSpec) -> Any:
    if spec.input_scale is None or not (isinstance(x, torch.Tensor) and x.is_floating_point()):
        return x
    return x * spec.input_scale + (spec.input_shift or 0.0)


def draw_inputs(problem: ModuleType, seed: int, spec: ProblemSpec) -> list[Any]:
    """`get_inputs()` after seeding with `seed` (on CPU), placed on the device in the run
    precision, scaled by the spec's input scale."""
    torch.manual_seed(seed)
    return [_scaled(_place(x, spec), spec) for x in problem.get_inputs()]


def seed_all(seed: int) -> None:
    """What `torch.manual_seed` does for the CPU and every initialised CUDA device (the same
    random streams), in ~2 us instead of ~70: it runs inside the harness's clock on every
    served call, where its cost and its jitter land on the number of record."""
    torch.default_generator.manual_seed(seed)
    if torch.cuda.is_initialized():
        for g in torch.cuda.default_generators:
            g.manual_seed(seed)


def draw_served_inputs(problem: ModuleType, seed: int, spec: ProblemSpec) -> list[Any]:
    """A served call's inputs: `get_inputs()` under `seed` with the device as the default, so
    they are drawn where they are used in microseconds (inside the harness's clock); the
    reference worker draws the same values for the same seed on the same device."""
    with torch.device(spec.device):
        seed_all(seed)
        raw = problem.get_inputs()
    return [_scaled(_place(x, spec), spec) for x in raw]


def noisy_model(cls: type, init: list[Any], spec: ProblemSpec, seed: int,
                fills_out: str | None = None, fills_in: str | None = None) -> torch.nn.Module:
    """A model built the same way in both processes, under a construction seed of its own.

    Every randomly initialised parameter is drawn under `seed`, and `torch.nn.init`'s constant
    fills (BatchNorm's and LayerNorm's ones and zeros, MobileNetV2's explicit re-inits) are
    replaced by seeded noisy fills, so no initial value can be assumed. Both happen inside the
    constructor: copies a candidate packs in `__init__` (pre-transposed weights, concatenated
    affine parameters) are made from the new values.

    The reference (`fills_out`) then perturbs its parameters that are still constant (made
    with `torch.ones`/`torch.zeros` outside `torch.nn.init`) and writes every filled or
    perturbed parameter, in order, for the candidate. The candidate (`fills_in`) maps its own
    filled or constant parameters, in order, to the first unclaimed reference fill of the same
    shape, whatever it names them; where its constructor filled one with another value (its
    fills came in another order), it is built again with each fill writing its mapped value, so
    packed copies stay valid; constant parameters get theirs afterwards. A candidate that makes
    its own BatchNorm affine parameters with `torch.ones` gets the reference's values; one that
    has none (it assumes ones and zeros) cannot match."""
    model, filled, calls = _noisy_build(cls, init, spec, seed)
    params = list(model.parameters())
    if fills_out is not None:
        perturbed = perturb_constant_parameters(model, seed)
        torch.save([p.detach().cpu() for p in params if id(p) in perturbed or id(p) in filled],
                   fills_out)
        return model
    if fills_in is None:
        return model
    fills: list[torch.Tensor] = torch.load(fills_in, weights_only=True)
    targets = _map_fills(params, filled, fills)
    if any(id(params[i]) in filled and not _equal(params[i], f) for i, f in targets.items()):
        by_id = {id(params[i]): f for i, f in targets.items()}
        model, _, _ = _noisy_build(cls, init, spec, seed, plan=[by_id.get(t) for t in calls])
        params = list(model.parameters())
    with torch.no_grad():
        for i, f in targets.items():
            if not _equal(params[i], f):
                params[i].copy_(f.to(device=params[i].device, dtype=params[i].dtype))
    return model


def _noisy_build(cls: type, init: list[Any], spec: ProblemSpec, seed: int,
                 plan: list[torch.Tensor | None] | None = None,
                 ) -> tuple[torch.nn.Module, set[int], list[int]]:
    torch.manual_seed(_derived(seed, "construction") % (2**63))
    filled: set[int] = set()
    calls: list[int] = []
    with torch.no_grad(), _noisy_constant_init(seed, filled, calls, plan):
        model = cls(*init)
    # Module.to() keeps the Parameter objects (it swaps their data), so the ids stay valid.
    return model.to(device=spec.device, dtype=_DTYPES[spec.precision]), filled, calls


def _equal(p: torch.Tensor, f: torch.Tensor) -> bool:
    cpu = p.detach().cpu()
    return cpu.shape == f.shape and torch.equal(cpu.to(f.dtype), f)


def _constant(p: torch.Tensor) -> bool:
    if not p.is_floating_point() or p.numel() == 0:
        return False
    flat = p.detach().reshape(-1)
    return bool((flat == flat[0]).all())


def _map_fills(params: list[torch.Tensor], filled: set[int],
               fills: list[torch.Tensor]) -> dict[int, torch.Tensor]:
    """Candidate parameter index -> reference fill, by order and shape."""
    claimed = [False] * len(fills)
    out: dict[int, torch.Tensor] = {}
    for i, p in enumerate(params):
        if id(p) not in filled and not _constant(p):
            continue
        for k, f in enumerate(fills):
            if not claimed[k] and tuple(f.shape) == tuple(p.shape):
                claimed[k] = True
                out[i] = f
                break
    return out


_CONSTANT_SPREAD = 0.05


def _derived(seed: int, key: str) -> int:
    return int.from_bytes(hashlib.sha256(f"{seed}:{key}".encode()).digest()[:8], "big") >> 1


def _noise(seed: int, key: str, shape: Any) -> torch.Tensor:
    gen = torch.Generator().manual_seed(_derived(seed, key))
    return torch.randn(tuple(shape), generator=gen, dtype=torch.float32) * _CONSTANT_SPREAD


@contextlib.contextmanager
def _noisy_constant_init(seed: int, filled: set[int] | None = None,
                         calls: list[int] | None = None,
                         plan: list[torch.Tensor | None] | None = None) -> Iterator[None]:
    """`torch.nn.init.ones_`/`zeros_`/`constant_` fill `value + 0.05 * noise` instead, wherever
    they are bound (modules import them by name: MultiheadAttention's `constant_`). The noise
    of a tensor depends on its value, shape and the order in which distinct tensors of that
    value and shape are first filled, not on how often it is filled: a model that skips a
    redundant re-init still matches one that does it."""
    init = torch.nn.init
    keys: dict[int, tuple[torch.Tensor, str]] = {}  # the tensor is kept so its id stays unique
    counts: dict[tuple[float, tuple[int, ...]], int] = {}

    def fill(tensor: torch.Tensor, value: float) -> torch.Tensor:
        with torch.no_grad():
            if not tensor.is_floating_point():
                return tensor.fill_(value)
            if id(tensor) not in keys:
                group = (float(value), tuple(tensor.shape))
                counts[group] = counts.get(group, 0) + 1
                keys[id(tensor)] = (tensor, f"const:{group}:{counts[group]}")
            k = len(calls) if calls is not None else 0
            if calls is not None:
                calls.append(id(tensor))
            if filled is not None:
                filled.add(id(tensor))
            want = plan[k] if plan is not None and k < len(plan) else None
            if want is not None and tuple(want.shape) == tuple(tensor.shape):
                return tensor.copy_(want.to(device=tensor.device, dtype=tensor.dtype))
            noise = _noise(seed, keys[id(tensor)][1], tensor.shape)
            return tensor.copy_((noise + float(value)).to(device=tensor.device,
                                                          dtype=tensor.dtype))

    replacements = {id(init.ones_): lambda tensor: fill(tensor, 1.0),
                    id(init.zeros_): lambda tensor: fill(tensor, 0.0),
                    id(init.constant_): lambda tensor, val: fill(tensor, val)}
    patched: list[tuple[dict[str, Any], str, Any]] = []
    for module in list(sys.modules.values()):
        namespace = getattr(module, "__dict__", None)
        if not isinstance(namespace, dict):
            continue
        for name, value in list(namespace.items()):
            if id(value) in replacements and isinstance(value, types.FunctionType):
                patched.append((namespace, name, value))
                namespace[name] = replacements[id(value)]
    try:
        yield
    finally:
        for namespace, name, value in patched:
            namespace[name] = value


def perturb_constant_parameters(model: torch.nn.Module, seed: int) -> set[int]:
    """Move every floating parameter that is still constant (all elements equal) by 0.05 times
    seeded normal noise, computed on CPU in float32. Buffers are left alone. Returns the ids of
    the parameters it moved."""
    moved: set[int] = set()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if not p.is_floating_point() or p.numel() == 0:
                continue
            base = p.detach().to("cpu", torch.float32)
            if not bool((base == base.reshape(-1)[0]).all()):
                continue
            noise = _noise(seed, f"param:{name}", base.shape)
            p.copy_((base + noise).to(device=p.device, dtype=p.dtype))
            moved.add(id(p))
    return moved


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
