"""Anti-cheat probes that run inside the candidate process; `evaluator.harness.checks` judges what they see.

- `Baseline.take()` at child start (after kloop's own set-up, before the candidate is imported):
  the identity of timer, synchronisation and comparison functions and of kloop's own functions,
  the global backend flags, the number of Python threads. `report()` compares against it.
- `os_threads()`: threads of the process, native ones included (counted around each call).
- `triton_launches()`: counts, or turns into no-ops, every Triton launch through the JIT entry (a
  class-level patch of `JITFunction.run`, so it reaches every kernel object however the
  candidate holds it).
- `ghost_compiled_launches()`: the launches that skip the JIT entry (a kept `CompiledKernel`,
  its launcher held on its own) turned into no-ops for the candidate's kernels, named by the
  driver from the function handle each launch passes (GPU).
- `record_extension_outputs()` / `ghost_extensions()`: the candidate's compiled extension
  functions, first watched to learn what they return, then replaced by stubs that launch
  nothing and return NaN of that layout, wherever the candidate keeps them (`refswap`).
- `custom_launches()`: the candidate's own kernels in a profiled call (GPU).
- `hooked_triton_launches()`: the candidate's own Triton kernels launched on the GPU, by name,
  seen by Triton's launch hook (no profiler: its first session costs seconds). A candidate can
  call the hook itself, so the caller believes it only beside `triton_launches()` (a real launch
  went through Triton's JIT entry) and counts anything else under the profiler.

They share the candidate's address space, so a determined candidate could defeat them; they back
up the static rules and the harness-side checks, which do not depend on the candidate process.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import importlib
import os
import sys
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch

from kloop.evaluator.common.protocol import ProbeMsg
from kloop.evaluator.worker.refswap import swapped

# Functions a candidate could replace to fake a time, a synchronisation or a comparison. Not
# torch.manual_seed: importing torch._dynamo (the profiler may) wraps it.
WATCHED = (
    "torch.cuda.Event", "torch.cuda.Event.record", "torch.cuda.Event.elapsed_time",
    "torch.cuda.Event.synchronize", "torch.cuda.Event.query", "torch.cuda.synchronize",
    "torch.cuda.current_stream", "torch.cuda.Stream.synchronize", "torch.cuda.Stream.wait_stream",
    "time.perf_counter", "time.perf_counter_ns", "time.monotonic", "time.time",
    "torch.allclose", "torch.isclose", "torch.equal", "torch.testing.assert_close",
    "torch.save", "torch.load", "torch.Tensor.cpu", "torch.Tensor.detach",
    "torch.Tensor.clone", "torch.Tensor.copy_", "torch.Tensor.to", "torch.Tensor.__eq__",
    "numpy.median", "numpy.percentile", "os.write", "kloop.evaluator.worker.child.Channel.send",
)
# kloop's own code in this process: every module-level function must stay the same object with
# the same code.
OWN_MODULES = tuple(f"kloop.evaluator.{m}" for m in (
    "worker.serve", "worker.candidate", "worker.trials", "worker.probes", "worker.child",
    "worker.construct", "correctness"))


def _effective(precision: str, allow_tf32: bool) -> str:
    """An fp32 precision setting as it acts: `none` (never set) follows the TF32 flag.
    Setting `set_float32_matmul_precision("highest")` turns `none` into `ieee`, which changes
    nothing where TF32 was already off (an honest candidate asking for strict's settings)."""
    if precision == "none":
        return "tf32" if allow_tf32 else "ieee"
    return precision


def _flag_getters() -> dict[str, Callable[[], Any]]:
    b = torch.backends
    return {
        "cuda.matmul.allow_tf32": lambda: b.cuda.matmul.allow_tf32,
        "cudnn.allow_tf32": lambda: b.cudnn.allow_tf32,
        "cudnn.benchmark": lambda: b.cudnn.benchmark,
        "cudnn.deterministic": lambda: b.cudnn.deterministic,
        "cudnn.enabled": lambda: b.cudnn.enabled,
        "float32_matmul_precision": torch.get_float32_matmul_precision,
        "deterministic_algorithms": torch.are_deterministic_algorithms_enabled,
        "matmul.allow_fp16_reduced_precision_reduction":
            lambda: b.cuda.matmul.allow_fp16_reduced_precision_reduction,
        "matmul.allow_bf16_reduced_precision_reduction":
            lambda: b.cuda.matmul.allow_bf16_reduced_precision_reduction,
        "cuda.matmul.fp32_precision": lambda: _effective(b.cuda.matmul.fp32_precision,
                                                         b.cuda.matmul.allow_tf32),
        "cudnn.conv.fp32_precision": lambda: _effective(b.cudnn.conv.fp32_precision,
                                                        b.cudnn.allow_tf32),
        "cudnn.rnn.fp32_precision": lambda: _effective(b.cudnn.rnn.fp32_precision,
                                                       b.cudnn.allow_tf32),
        "default_dtype": torch.get_default_dtype,
        "flash_sdp": b.cuda.flash_sdp_enabled,
        "mem_efficient_sdp": b.cuda.mem_efficient_sdp_enabled,
        "math_sdp": b.cuda.math_sdp_enabled,
    }


def _resolve(dotted: str) -> Any:
    parts = dotted.split(".")
    for i in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:i]))
        except ImportError:
            continue
        for attr in parts[i:]:
            obj = getattr(obj, attr)
        return obj
    raise ImportError(dotted)


def _watched() -> dict[str, Any]:
    out = {}
    for name in WATCHED:
        try:
            out[name] = _resolve(name)
        except (ImportError, AttributeError):
            continue
    for mod_name in OWN_MODULES:
        mod = sys.modules.get(mod_name)
        # Everything callable they hold, their own functions and the ones they bound at
        # import (the timing module's `_cuda_sync`, `_perf_counter`...).
        for attr, value in vars(mod).items() if mod is not None else ():
            if callable(value):
                out[f"{mod_name}.{attr}"] = value
    return out


def _flags() -> dict[str, str]:
    out = {}
    for name, get in _flag_getters().items():
        try:
            out[name] = repr(get())
        except (AttributeError, RuntimeError):
            continue
    return out


@dataclass
class Baseline:
    """What the process looked like before any candidate code ran."""

    objects: dict[str, Any] = field(default_factory=dict)
    codes: dict[str, Any] = field(default_factory=dict)
    flags: dict[str, str] = field(default_factory=dict)
    py_threads: int = 0
    l2_bytes: int | None = None
    """The persisting-L2 carve-out (GPU), which survives the L2 flush between timed calls."""

    @classmethod
    def take(cls, device: str = "cpu") -> Baseline:
        objects = _watched()
        base = cls(objects=objects,
                   codes={k: getattr(v, "__code__", None) for k, v in objects.items()},
                   flags=_flags(), py_threads=threading.active_count())
        base.take_device(device)
        return base

    def take_device(self, device: str) -> None:
        """The device's part (a child built ahead takes it once the device is its: nothing
        could change it before, the device was hidden)."""
        if device == "cuda":
            torch.zeros(1, device="cuda")  # the context the limit belongs to
            self.l2_bytes = persisting_l2_bytes()

    def restore_l2(self) -> None:
        """Put the carve-out back before timing, whatever the candidate set."""
        if self.l2_bytes is not None and persisting_l2_bytes() != self.l2_bytes:
            set_persisting_l2_bytes(self.l2_bytes)

    def tampered(self) -> list[str]:
        now = _watched()
        return sorted(name for name, obj in self.objects.items()
                      if now.get(name) is not obj
                      or getattr(obj, "__code__", None) is not self.codes[name])

    def changed_flags(self) -> list[str]:
        now = _flags()
        return [f"{k}: {v} -> {now.get(k)}" for k, v in self.flags.items() if now.get(k) != v]

    def extra_threads(self) -> int:
        return threading.active_count() - self.py_threads

    def report(self, when: str) -> list[ProbeMsg]:
        """The process-level probes, clean or not (`when` names the phase in the detail)."""
        extra = self.extra_threads()
        l2 = persisting_l2_bytes() if self.l2_bytes is not None else None
        changed = l2 is not None and l2 != self.l2_bytes
        return [
            ProbeMsg(probe="l2_persistence", detail=when, names=[
                f"persisting L2 carve-out {self.l2_bytes} -> {l2} bytes"] if changed else []),
            ProbeMsg(probe="identity", names=self.tampered(), detail=when),
            ProbeMsg(probe="backend_flags", names=self.changed_flags(), detail=when),
            ProbeMsg(probe="threads", value=float(extra), detail=f"{when}: "
                     f"{', '.join(t.name for t in threading.enumerate()[-extra:]) if extra > 0 else ''}"),
        ]


CU_LIMIT_PERSISTING_L2_CACHE_SIZE = 0x06


@functools.lru_cache(maxsize=1)
def _driver() -> ctypes.CDLL | None:
    try:
        return ctypes.CDLL("libcuda.so.1")
    except OSError:
        return None


def persisting_l2_bytes() -> int | None:
    """The current CUDA context's persisting-L2 carve-out in bytes; None when unreadable."""
    lib = _driver()
    value = ctypes.c_size_t()
    if lib is None or lib.cuCtxGetLimit(ctypes.byref(value), CU_LIMIT_PERSISTING_L2_CACHE_SIZE):
        return None
    return int(value.value)


def set_persisting_l2_bytes(size: int) -> None:
    lib = _driver()
    if lib is not None:
        lib.cuCtxSetLimit(CU_LIMIT_PERSISTING_L2_CACHE_SIZE, ctypes.c_size_t(size))


def os_threads() -> int:
    try:
        return len(os.listdir("/proc/self/task"))
    except OSError:
        return threading.active_count()


# ---- the candidate's own kernels ----------------------------------------------------------


@dataclass
class Launches:
    count: int = 0


def _launcher_classes() -> list[type]:
    out = []
    if "triton" not in sys.modules:
        return out
    with contextlib.suppress(ImportError):
        from triton.runtime.jit import JITFunction

        out.append(JITFunction)
    with contextlib.suppress(ImportError):
        from triton.runtime.interpreter import InterpretedFunction

        out.append(InterpretedFunction)
    return out


_MISSING = object()


@contextlib.contextmanager
def triton_launches(noop: bool = False, names: set[str] | None = None) -> Iterator[Launches]:
    """Count every Triton kernel launch in the block that went through (with `names`: of
    kernels so named only); with `noop`, count and skip them all."""
    seen = Launches()
    saved = []

    def counted(kernel: Any) -> bool:
        fn = getattr(kernel, "fn", None)
        return names is None or getattr(fn, "__name__", None) in names

    for cls in _launcher_classes():
        original = cls.run
        saved.append((cls, cls.__dict__.get("run", _MISSING)))

        def run(self, *args, _original=original, **kwargs):
            if noop:
                seen.count += 1
                return None
            result = _original(self, *args, **kwargs)
            if counted(self):  # a launch that raised (bad arguments) launched nothing
                seen.count += 1
            return result

        cls.run = run
    try:
        yield seen
    finally:
        for cls, original in saved:
            if original is _MISSING:
                del cls.run
            else:
                cls.run = original


def _launcher_class() -> type | None:
    """Triton's launcher class on this GPU: every compiled kernel's launch calls an instance of
    it (`CompiledKernel.run`), whether it came through the JIT entry, `kernel[grid]` on a kept
    `CompiledKernel`, or the launcher kept on its own. None without an active GPU driver (the
    interpreter has no compiled kernels)."""
    if "triton" not in sys.modules:
        return None
    try:
        from triton.runtime import driver

        cls = driver.active.launcher_cls
    except Exception:  # no GPU backend active (CPU, the interpreter)
        return None
    return cls if isinstance(cls, type) else None


def function_name(handle: Any) -> str | None:
    """The name of a loaded kernel from its `CUfunction` handle, as the driver has it; None
    when the driver cannot say (no libcuda, a driver before `cuFuncGetName`, not a handle)."""
    lib = _driver()
    get = getattr(lib, "cuFuncGetName", None) if lib is not None else None
    if get is None or not isinstance(handle, int) or handle == 0:
        return None
    name = ctypes.c_char_p()
    try:
        if get(ctypes.byref(name), ctypes.c_void_p(handle)) != 0 or name.value is None:
            return None
    except Exception:
        return None
    return name.value.decode(errors="replace")


_FUNCTION_ARG = 4
"""Where the `CUfunction` handle sits in the launcher's positional arguments (gridX, gridY,
gridZ, stream, function, ...: Triton 3.4-3.7)."""


@contextlib.contextmanager
def ghost_compiled_launches(names: set[str]) -> Iterator[Launches]:
    """Launches of the candidate's kernels (named in `names`) that reach Triton's launcher
    without the JIT entry become no-ops (counted): a decorative kernel kept as a
    `CompiledKernel` used to leave the ghost trial without a stub to go through. Launches the
    driver cannot name run as they are (the profiler then counts them as having got past the
    stubs, and the ghost trial concludes nothing). What stays out of reach: a launch made
    below the launcher (its C entry point, or the driver through ctypes)."""
    seen = Launches()
    cls = _launcher_class()
    if cls is None or not names:
        yield seen
        return
    original = cls.__dict__.get("__call__", _MISSING)
    inherited = cls.__call__
    named: dict[int, str | None] = {}

    def call(self, *args, **kwargs):
        handle = args[_FUNCTION_ARG] if len(args) > _FUNCTION_ARG else kwargs.get("function")
        key = handle if isinstance(handle, int) else -1
        if key not in named:
            named[key] = function_name(handle)
        if named[key] in names:
            seen.count += 1
            return None
        return inherited(self, *args, **kwargs)

    cls.__call__ = call
    try:
        yield seen
    finally:
        if original is _MISSING:
            del cls.__call__
        else:
            cls.__call__ = original


# Output layout of each extension function by the shapes of its arguments, recorded during a
# real call, so that a stub can return what the real function would have.
_OUTPUTS: dict[tuple[Any, ...], Any] = {}


def _call_key(name: str, args: tuple, kwargs: dict) -> tuple[Any, ...]:
    return (name, *(tuple(a.shape) if isinstance(a, torch.Tensor) else repr(a)
                    for a in [*args, *kwargs.values()]))


def _layout(out: Any) -> Any:
    if isinstance(out, torch.Tensor):
        return (tuple(out.shape), out.dtype, out.device)
    if isinstance(out, (tuple, list)):
        return [_layout(o) for o in out]
    return None


def _nan(layout: Any) -> Any:
    if isinstance(layout, list):
        return tuple(_nan(x) for x in layout)
    if layout is None:
        return None
    shape, dtype, device = layout
    fill = float("nan") if dtype.is_floating_point else 0
    return torch.full(shape, fill, dtype=dtype, device=device)


def _nan_like(args: tuple, kwargs: dict) -> Any:
    like = next((a for a in [*args, *kwargs.values()] if isinstance(a, torch.Tensor)), None)
    return None if like is None else _nan((tuple(like.shape), like.dtype, like.device))


@contextlib.contextmanager
def _swap_extensions(make: Callable[[str, Any], Any]) -> Iterator[None]:
    """Replace the functions of the extensions the candidate built (load_inline) by
    `make(name, function)` wherever anything the garbage collector sees refers to them: the
    extension modules, the candidate's module and modules, and any list, tuple, closure,
    partial, default argument or class attribute (`evaluator.worker.refswap`)."""
    from kloop.evaluator.build.buildcache import LOADED_MODULES

    names: dict[int, str] = {}
    originals: list[Any] = []
    for m in LOADED_MODULES:
        for n, f in vars(m).items():
            if not n.startswith("_") and callable(f) and not isinstance(f, type) \
                    and id(f) not in names:
                names[id(f)] = n
                originals.append(f)
    pairs = [(f, make(names[id(f)], f)) for f in originals]
    del originals
    with swapped(pairs):
        yield


def record_extension_outputs() -> contextlib.AbstractContextManager:
    """Calls go through to the real extension functions; their output layouts are recorded."""
    def make(name: str, fn: Any) -> Any:
        def recorder(*args, **kwargs):
            out = fn(*args, **kwargs)
            _OUTPUTS[_call_key(name, args, kwargs)] = _layout(out)
            return out
        return recorder
    return _swap_extensions(make)


@contextlib.contextmanager
def ghost_extensions() -> Iterator[Launches]:
    """Extension functions become stubs that launch nothing and return NaN laid out as the real
    call returned it (recorded earlier), else like their first tensor argument."""
    seen = Launches()

    def make(name: str, fn: Any) -> Any:
        def stub(*args, **kwargs):
            seen.count += 1
            layout = _OUTPUTS.get(_call_key(name, args, kwargs), _MISSING)
            return _nan_like(args, kwargs) if layout is _MISSING else _nan(layout)
        return stub

    with _swap_extensions(make):
        yield seen


def custom_launches(call: Callable[[], Any], names: set[str]) -> tuple[Any, int | None]:
    """(result of `call()`, launches of kernels named in `names` on the GPU during it); the
    count is None when there are no names to look for. Device activity only, counted from the
    profiler's raw events: CPU activity and `key_averages()` added nothing to the count and
    cost 0.6 s on an LSTM's 17,000 events (bench/diag_ghost.py, H100, 2026-12-06)."""
    if not names:  # nothing to count: no profiler (CUPTI can slow the calls timed later)
        return call(), None
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        result = call()
        torch.cuda.synchronize()
    return result, device_kernel_count(prof, names)


def device_kernel_count(prof: Any, names: set[str]) -> int:
    """Kernels on the device named in `names` (as `profile.classify` names them) among a
    finished profiler's events."""
    from torch.autograd import DeviceType

    from kloop.evaluator.worker.profile import classify

    return sum(1 for e in prof.profiler.kineto_results.events()
               if e.device_type() == DeviceType.CUDA and classify(e.name(), names) == "custom")


@contextlib.contextmanager
def hooked_triton_launches(names: set[str]) -> Iterator[Launches]:
    """Count the launches of Triton kernels named in `names` that go through Triton's launcher
    (every path of a compiled kernel does: `kernel[grid]`, autotuners, kept `CompiledKernel`s),
    with Triton's launch-enter hook. Launches it cannot see (a CUDA graph replay, a launch from
    native code) leave the count at zero, and a candidate can call the hook with any name:
    never believe it alone (`trials._gpu_launches`). A hook the candidate set itself is still
    called."""
    seen = Launches()
    knobs = _launch_knobs()
    if knobs is None:
        yield seen
        return

    def enter(metadata: Any) -> None:
        data = getattr(metadata, "data", None)
        if isinstance(data, dict) and data.get("name") in names:
            seen.count += 1

    hooks = knobs.launch_enter_hook
    if hasattr(hooks, "add"):  # a chain of hooks (Triton 3.7)
        hooks.add(enter)
        try:
            yield seen
        finally:
            hooks.remove(enter)
        return
    outer = hooks  # one hook (Triton 3.4-3.6): ours calls the candidate's, if it set one

    def chained(metadata: Any) -> Any:
        enter(metadata)
        return outer(metadata) if outer is not None else None

    knobs.launch_enter_hook = chained
    try:
        yield seen
    finally:
        if knobs.launch_enter_hook is chained:  # unless the candidate replaced it meanwhile
            knobs.launch_enter_hook = outer


def _launch_knobs() -> Any:
    """Where this Triton keeps its launch hooks (`triton.knobs.runtime`, 3.4 and later)."""
    if "triton" not in sys.modules:
        return None
    try:
        from triton import knobs
    except ImportError:
        return None
    runtime = getattr(knobs, "runtime", None)
    return runtime if hasattr(runtime, "launch_enter_hook") else None
