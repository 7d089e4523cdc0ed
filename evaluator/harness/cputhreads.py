"""The harness's own tensor work runs on one CPU thread while it evaluates.

Why: PyTorch's CPU ops run on an OpenMP team, and libgomp's threads keep spinning for a while
(up to tens of milliseconds) after each parallel op before they sleep. Between two timed calls
of a candidate the harness compares the last output with the reference's (a parallel op on a
large output); the reference worker's calls are only stored. On a 16-core GPU host the
harness's spinning team then competes for the CPU with the worker that launches the next timed
call, and a forward's launches land on its own CUDA events and on the trusted clock: the same
code read 3-12 % slower as a candidate than as the reference (4x for a launch-bound model),
whatever else was tried (GPU_VALIDATION.md, sessions 4-7). On the 2-core CI host a process
pinned to one core ran a loop up to 36 % slower right after the harness's parallel op when a
spinning thread shared its core, and never with one thread or OMP_WAIT_POLICY=PASSIVE
(bench/diag_threads.py --cpu; the GPU mode there compares the two settings on real models).

OpenMP's thread count is per thread (a Python thread that already ran a parallel op keeps its
own), so each evaluating thread sets its own, for the length of the evaluation, and puts the
caller's back afterwards. One thread costs only time off the clock (a comparison of a 64 MiB
output takes tens of milliseconds).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch


@contextmanager
def one_cpu_thread() -> Iterator[None]:
    """This thread's intra-op CPU threads set to one inside the block, the caller's after."""
    before = torch.get_num_threads()
    if before == 1:
        yield
        return
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)
