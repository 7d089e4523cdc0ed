"""The trusted L2 flusher's process (`evaluator.harness.flusher`): runs no candidate code.

Before every timed call the harness asks it to write a buffer four times the size of the
device's L2 and waits for the answer; since the L2 is one per device, that evicts whatever
another process (the candidate's, the reference worker's) left in it. A flush done inside the
candidate's own process could be skipped by its native code, keeping its weights in L2 for
the timed calls. Before each flush it also asks the driver to turn persisting-L2 lines back to
normal ones (an access-policy window would otherwise keep them through the flush; catalog T5),
and reports whether the driver accepted.

    python -m evaluator.worker.flush_worker <device> <request fd> <reply fd>

Protocol: one byte `f` asks for a flush, the answer is `k` (done, persisting lines reset), `n`
(done, the reset was refused or is not available) or nothing (the process is gone); `q` ends it.
On `cpu` it writes a host buffer, so the protocol runs in CPU tests; it means nothing there.
"""

from __future__ import annotations

import ctypes
import os
import sys

_MIN_BYTES = 256 << 20
_CPU_BYTES = 64 << 20


def _cudart() -> ctypes.CDLL | None:
    """The CUDA runtime torch loaded (the same library, so the same context)."""
    try:
        with open("/proc/self/maps") as f:
            paths = {line.split()[-1] for line in f if "libcudart" in line}
    except OSError:
        return None
    for path in sorted(paths):
        try:
            return ctypes.CDLL(path)
        except OSError:
            continue
    return None


def main(argv: list[str]) -> int:
    device, req, rep = argv[1], int(argv[2]), int(argv[3])
    import torch

    if device == "cpu":
        buf = torch.empty(_CPU_BYTES // 4, dtype=torch.int32)
        cudart = None
    else:
        torch.cuda.set_device(torch.device(device))
        l2 = int(getattr(torch.cuda.get_device_properties(device), "L2_cache_size", 0) or 0)
        buf = torch.empty(max(_MIN_BYTES, 4 * l2) // 4, dtype=torch.int32, device=device)
        torch.cuda.synchronize()
        cudart = _cudart()
    os.write(rep, b"r")  # ready: the context exists and the buffer is allocated
    n = 0
    while True:
        op = os.read(req, 1)
        if op in (b"", b"q"):
            return 0
        n += 1
        reset = cudart is not None and cudart.cudaCtxResetPersistingL2Cache() == 0
        buf.fill_(n & 0x7FFFFFFF)
        if device != "cpu":
            torch.cuda.synchronize()
        os.write(rep, b"k" if reset else b"n")


if __name__ == "__main__":
    sys.exit(main(sys.argv))
