"""The GPU's clocks, temperature, power and throttle reasons, read by the harness through NVML
just before the first and after the last timed call of a plan (never inside the clock). Kept
with each timing, so a slow number can be told apart from a slow device (a cold or throttled SM
clock). The harness never creates a CUDA context for this: NVML is the driver's management
library, and a machine without it (CPU) records nothing.
"""

from __future__ import annotations

import ctypes
import threading

from kloop.evaluator.common.result import GpuSample

_NVML_CLOCK_SM, _NVML_CLOCK_MEM, _NVML_TEMPERATURE_GPU = 1, 2, 0
_REASONS = {0x1: "gpu_idle", 0x2: "applications_clocks", 0x4: "sw_power_cap",
            0x8: "hw_slowdown", 0x10: "sync_boost", 0x20: "sw_thermal", 0x40: "hw_thermal",
            0x80: "hw_power_brake", 0x100: "display_clocks"}

_lib: ctypes.CDLL | None = None
_tried = False
_lock = threading.Lock()


def _nvml() -> ctypes.CDLL | None:
    global _lib, _tried
    with _lock:
        if not _tried:
            _tried = True
            try:
                lib = ctypes.CDLL("libnvidia-ml.so.1")
                if lib.nvmlInit_v2() == 0:
                    _lib = lib
            except (OSError, AttributeError):
                _lib = None
        return _lib


def uuid(device: str) -> str | None:
    """The UUID of `device` as `CUDA_VISIBLE_DEVICES` names it (an index or a UUID), None
    without NVML. Indexes are NVML's (PCI bus order), as in `sample`."""
    lib = _nvml()
    if lib is None or not device.isdigit():
        return device if device.startswith(("GPU-", "MIG-")) else None
    handle, buf = ctypes.c_void_p(), ctypes.create_string_buffer(96)
    if lib.nvmlDeviceGetHandleByIndex_v2(ctypes.c_uint(int(device)), ctypes.byref(handle)) != 0:
        return None
    if lib.nvmlDeviceGetUUID(handle, buf, ctypes.c_uint(len(buf))) != 0:
        return None
    return buf.value.decode() or None


def _handle(lib: ctypes.CDLL, device: str) -> ctypes.c_void_p | None:
    """NVML's handle of `device` (an index or a UUID), None if it names none."""
    handle = ctypes.c_void_p()
    if device.startswith(("GPU-", "MIG-")):
        rc = lib.nvmlDeviceGetHandleByUUID(device.encode(), ctypes.byref(handle))
    elif device.isdigit():
        rc = lib.nvmlDeviceGetHandleByIndex_v2(ctypes.c_uint(int(device)), ctypes.byref(handle))
    else:
        return None
    return handle if rc == 0 else None


def sample(device: str) -> GpuSample | None:
    """`device` as `CUDA_VISIBLE_DEVICES` names it to the children (an index or a UUID)."""
    lib = _nvml()
    handle = _handle(lib, device) if lib is not None else None
    if lib is None or handle is None:
        return None

    def uint(fn, *args) -> int | None:
        v = ctypes.c_uint()
        return v.value if fn(handle, *args, ctypes.byref(v)) == 0 else None

    reasons = ctypes.c_ulonglong()
    getter = getattr(lib, "nvmlDeviceGetCurrentClocksEventReasons", None) or \
        getattr(lib, "nvmlDeviceGetCurrentClocksThrottleReasons", None)
    active = None
    if getter is not None and getter(handle, ctypes.byref(reasons)) == 0:
        active = [name for bit, name in _REASONS.items() if reasons.value & bit]
    power = uint(lib.nvmlDeviceGetPowerUsage)
    return GpuSample(sm_clock_mhz=uint(lib.nvmlDeviceGetClockInfo, _NVML_CLOCK_SM),
                     mem_clock_mhz=uint(lib.nvmlDeviceGetClockInfo, _NVML_CLOCK_MEM),
                     temperature_c=uint(lib.nvmlDeviceGetTemperature, _NVML_TEMPERATURE_GPU),
                     power_w=None if power is None else power / 1000.0,
                     clock_limits=active)


class _Memory(ctypes.Structure):
    _fields_ = [("total", ctypes.c_ulonglong), ("free", ctypes.c_ulonglong),
                ("used", ctypes.c_ulonglong)]


def memory(device: str) -> tuple[int, int] | None:
    """(free, total) bytes of `device`'s memory as NVML counts it (every process's use), None
    without NVML. `device` as in `sample`."""
    lib = _nvml()
    handle = _handle(lib, device) if lib is not None else None
    mem = _Memory()
    if lib is None or handle is None or lib.nvmlDeviceGetMemoryInfo(handle, ctypes.byref(mem)):
        return None
    return int(mem.free), int(mem.total)
