"""The JIT prime (runs in a child with no GPU, outside the device lock): compile the candidate's
Triton kernels for the evaluation's GPU without running anything on it.

The candidate child compiles each Triton kernel at its first launch, under the exclusive device
lock (0.3-1 s of CPU per new kernel on the H200). This child instead builds the candidate and
calls it once with every tensor on PyTorch's `meta` device (shapes and dtypes, no data), with
Triton's driver replaced by a compile-only one for the GPU's architecture and every launch
turned into Triton's own compile-only path (`warmup=True`: compile, cache, do not launch).
The kernels land in the evaluation's own Triton cache under the keys the candidate child will
compute (same source, target, options, argument types and specialisations: a meta tensor's
pointer is 0, aligned as the caching allocator's are), so its first launch finds them.

Best effort: whatever the candidate does that needs real data or a device (`.item()`, a
device-property query, an autotuner's benchmark) ends the prime there, and the candidate child
compiles the rest under the lock as before. Nothing here is judged: the child that runs
candidate code outside the lock has no GPU (its device nodes are hidden) and writes only to
this evaluation's dirs.
"""

from __future__ import annotations

import glob
import os
import stat
from typing import Any

import torch
from torch.overrides import TorchFunctionMode

from kloop.evaluator.common.protocol import PRIME_ARCH_ENV, CandidateJob, DoneMsg
from kloop.evaluator.worker.child import Channel, apply_overrides, import_candidate
from kloop.evaluator.worker.construct import load_problem

META = torch.device("meta")


class _CompileOnlyDriver:
    """What Triton's JIT asks its driver for on the way to a compile (device, stream, target)."""

    def __init__(self, arch: int) -> None:
        from triton.backends.compiler import GPUTarget

        self.target = GPUTarget("cuda", arch, 32)

    def get_current_device(self) -> int:
        return 0

    def set_current_device(self, device: int) -> None:
        pass

    def get_current_stream(self, device: int | None = None) -> int:
        return 0

    def get_current_target(self) -> Any:
        return self.target

    def get_active_torch_device(self) -> torch.device:
        return META

    def get_device_capability(self, device: int | None = None) -> tuple[int, int]:
        return divmod(self.target.arch, 10)


def install_compile_only(arch: int) -> None:
    """Triton in this process compiles for `arch` and launches nothing."""
    from triton.runtime.autotuner import Autotuner
    from triton.runtime.driver import driver
    from triton.runtime.jit import JITFunction

    driver.set_active(_CompileOnlyDriver(arch))
    run = JITFunction.run

    def compile_only(self, *args, grid, warmup, **kwargs):
        kernel = run(self, *args, grid=grid, warmup=True, **kwargs)
        build_launcher(kernel)
        return kernel

    def every_config(self, *args, **kwargs):
        # Each config is what the candidate child's autotuner will compile and benchmark.
        kernel = None
        for config in self.configs:
            kernel = self.fn.run(*args, **{**kwargs, **config.all_kwargs()})
        return kernel

    JITFunction.run = compile_only  # type: ignore[method-assign]
    Autotuner.run = every_config  # type: ignore[method-assign]


_launchers: set[str] = set()


def build_launcher(kernel: Any) -> None:
    """Triton's launcher module for the kernel's signature, which Triton 3.6 builds with gcc
    (and caches beside the kernels, keyed by its C source) at the first launch, i.e. under the
    exclusive lock: built here, the candidate child loads it. It needs gcc and `libcuda.so`,
    no device. Where a Triton version has no per-signature module (3.7 launches through one
    shared module and asks the active driver for it, which here is compile-only) this does
    nothing; any failure leaves the build to the candidate child, as before."""
    key = getattr(kernel, "hash", None) or str(id(kernel))
    if kernel is None or key in _launchers:
        return
    _launchers.add(key)
    try:
        from triton.backends.nvidia.driver import CudaLauncher

        CudaLauncher(kernel.src, kernel.metadata)
    except Exception:  # best effort: the candidate child builds what is missing
        pass


def _meta(device: Any) -> Any:
    try:
        return META if torch.device(device).type == "cuda" else device
    except (RuntimeError, TypeError):
        return device


class _CudaOnMeta(TorchFunctionMode):
    """Tensors the candidate puts on the GPU (`device="cuda"`, `.cuda()`, `.to("cuda")`) go to
    `meta` instead: no data, no device."""

    def __torch_function__(self, func, types_, args=(), kwargs=None):
        kwargs = dict(kwargs or {})
        if "device" in kwargs:
            kwargs["device"] = _meta(kwargs["device"])
        if func is torch.Tensor.cuda:
            return args[0].to(META)
        if func is torch.Tensor.to:
            args = tuple(_meta(a) if isinstance(a, (str, torch.device)) else a for a in args)
        return func(*args, **kwargs)


def gpu_reachable(pattern: str = "/dev/nvidia*") -> bool:
    """Whether a GPU device node is still a device here. The harness hides each one behind
    /dev/null (character device 1:3) in this child's mount namespace; where that could not be
    done (no privilege, no user namespaces) the prime must not run candidate code at all."""
    for path in glob.glob(pattern):
        try:
            st = os.stat(path)
        except OSError:
            continue
        if stat.S_ISCHR(st.st_mode) and os.major(st.st_rdev) != 1:
            return True
    return False


def run_prime(job: CandidateJob, ch: Channel) -> None:
    if gpu_reachable():  # checked before any candidate code runs
        raise SystemExit("kloop: the GPU is reachable from the prime child: nothing compiled")
    install_compile_only(int(os.environ[PRIME_ARCH_ENV]))
    spec = job.problem.model_copy(update={"device": "cpu"})
    ch.stage("load")
    problem = load_problem(spec)
    module = import_candidate(job.candidate_path)
    apply_overrides(module, spec.overrides)
    torch.cuda.is_available = lambda: True  # what the candidate child will see
    with torch.no_grad(), torch.device(META), _CudaOnMeta():
        model = module.ModelNew(*problem.get_init_inputs())
        ch.stage("correctness")
        model(*problem.get_inputs())
    ch.send(DoneMsg())
