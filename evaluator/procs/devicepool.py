"""Every GPU on the host: `device: auto` (or `cuda`) spreads evaluations over all visible GPUs.

Each evaluation claims one device when it is created and keeps it to the end (its compile
target, reference worker, baselines and timings all belong to that GPU); the claim goes to the
device with the fewest evaluations of this process in flight, the lowest index on a tie. Each
device keeps its own lock (`evaluator.procs.devicelock`), so timings on one GPU never overlap while the
other GPUs time other candidates. Baselines are cached per GPU model (`reference.key_fields`),
so a pool of one model measures each problem's compile baseline once.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

_guard = threading.Lock()
_in_flight: dict[str, int] = {}


def gpu_count() -> int:
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def pool(requested: str) -> list[str]:
    """The devices `requested` may use: `cpu`; `cuda:N` alone; `cuda` and `auto` every visible
    GPU (`auto` falls back to `cpu` where there is none)."""
    if requested == "cpu":
        return ["cpu"]
    count = gpu_count()
    if requested.startswith("cuda:"):
        index = int(requested[5:])
        if index >= count:
            raise RuntimeError(f"device {requested!r} requested but {count} CUDA device(s) "
                               "are visible")
        return [requested]
    if count == 0:
        if requested == "auto":
            return ["cpu"]
        raise RuntimeError(f"device {requested!r} requested but no CUDA device is available")
    return [f"cuda:{i}" for i in range(count)]


@dataclass
class Claim:
    """One evaluation's device, counted in flight until `release`."""

    device: str
    _released: bool = False

    def release(self) -> None:
        with _guard:
            if not self._released:
                self._released = True
                _in_flight[self.device] -= 1


def claim(requested: str) -> Claim:
    devices = pool(requested)
    with _guard:
        device = min(devices, key=lambda d: (_in_flight.get(d, 0), devices.index(d)))
        _in_flight[device] = _in_flight.get(device, 0) + 1
    return Claim(device)


def in_flight() -> dict[str, int]:
    """Evaluations of this process in flight per device (for progress lines and tests)."""
    with _guard:
        return {d: n for d, n in _in_flight.items() if n}
