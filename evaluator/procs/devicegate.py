"""One gate per process for the device stages: evaluations share it, one that ran out of device
memory beside another holds it alone for its second run (`harness.pipeline.device_half`).

Evaluations waiting for the device lock keep their models (reference workers, candidates built
ahead) in the GPU's memory, so at full sizes the GPU can run out beside them: on the H100, 8 at
once, L3/31's reference (8 GiB at a time) and L3/1's lean candidate ran out beside the others and
were correct alone (2026-12-05, efd21a1 and 92b4b81). `evaluate` from several threads (`kloop
run`'s episodes) and the scheduler's device halves all pass through this gate; other processes
on the same GPU do not (one kloop process per GPU host is the setting this covers).
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator

_OUT_OF_MEMORY = ("OutOfMemoryError", "CUDA out of memory", "CUDA error: out of memory",
                  "cudaErrorMemoryAllocation", "CUBLAS_STATUS_ALLOC_FAILED",
                  "CUBLAS_STATUS_NOT_INITIALIZED", "CUDNN_STATUS_ALLOC_FAILED",
                  "CUDA_ERROR_OUT_OF_MEMORY")
"""What torch's allocator, a checked CUDA call (`C10_CUDA_CHECK` in an extension), the CUDA
runtime, cuBLAS (whose handle cannot be made without memory: NOT_INITIALIZED), cuDNN and the
driver say when device memory runs out. Generous on purpose: a false match costs one more
evaluation alone, never a verdict."""


def out_of_device_memory(text: str | None) -> bool:
    return bool(text) and any(m in text for m in _OUT_OF_MEMORY)


class Hold:
    crowded = False
    """Another evaluation was in its device stages at some moment of this one's."""


class DeviceGate:
    """Evaluations in their device stages share it; a retry after running out of device memory
    holds it alone (and, waiting, keeps new ones out, so it is not starved)."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._holds: list[Hold] = []
        self._alone = False
        self._waiting_alone = 0

    @contextlib.contextmanager
    def shared(self) -> Iterator[Hold]:
        hold = Hold()
        with self._cond:
            while self._alone or self._waiting_alone:
                self._cond.wait()
            self._holds.append(hold)
            if len(self._holds) > 1:
                for h in self._holds:
                    h.crowded = True
        try:
            yield hold
        finally:
            with self._cond:
                self._holds.remove(hold)
                self._cond.notify_all()

    @contextlib.contextmanager
    def alone(self) -> Iterator[None]:
        with self._cond:
            self._waiting_alone += 1
            while self._alone or self._holds:
                self._cond.wait()
            self._waiting_alone -= 1
            self._alone = True
        try:
            yield
        finally:
            with self._cond:
                self._alone = False
                self._cond.notify_all()


GATE = DeviceGate()
"""This process's."""
