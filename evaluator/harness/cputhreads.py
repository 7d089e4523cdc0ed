"""The harness's own tensor work between timed calls runs on one CPU thread.

Why: PyTorch's CPU ops run on an OpenMP team, and libgomp's threads keep spinning for a while
(up to tens of milliseconds) after each parallel op before they sleep. Between two timed calls
of a candidate the harness compares the last output with the reference's (a parallel op on a
large output); the reference worker's calls are only stored. On a 16-core GPU host the
harness's spinning team then competes for the CPU with the worker that launches the next timed
call, and a forward's launches land on its own CUDA events and on the trusted clock. On the
H200 (bench/diag_threads.py, 2026-12-02 at e5f40a6) the candidate's own event median over
the reference worker's, for the same code, went from 1.07 to 0.99 (L3/1 at batch 1024, 1.8 ms)
and from 1.06-1.08 to 1.00-1.05 (L3/4), the same-code speedup at batch 1024 from 0.85-0.91 to
0.98-1.06. At L3/1's full size (3.9 ms) both settings read 1.03-1.04: a smaller gap remains
there, cause open. On the 2-core CI host the mechanism shows only when a spinning thread shares
the victim's core (bench/diag_threads.py --cpu: 1.00-1.36, never with one thread).

Where: `harness.served.run_plan`, the served calls' loop (its warm-up calls, at least 25 ms on a
GPU, outlast the spinning of any team left from before). The probe trials' full comparisons run
before it with every thread (one thread made a 64 MiB comparison 1.4 s on the CI host; outputs
reach 4 GiB); the timed calls' test is one `torch.isclose` (`ExpectedStore.passes`, 3.7 ms for
4 MiB on one thread). The H200 figures above are from e5f40a6, which had the whole evaluation
on one thread; this placement (the loop only) kept them there (2026-12-02 at 6b3972f: 0.995 vs
0.982 at L3/1 batch 1024, 0.966 vs 1.112 at L3/4).
OpenMP's thread count is per thread (a Python thread that already ran a parallel op keeps its
own), so the loop's thread sets its own and puts the caller's back afterwards.
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


@contextmanager
def judging_thread() -> Iterator[None]:
    """The harness's judging of the lock holder's probe trials (`harness.judge`), on a host
    with quiet cores (`harness.cores`): on the timer core, with one intra-op thread, as the
    served-call loop that follows it runs. Elsewhere (a small host) as before: every thread.

    Why: on the H200 the harness took 0.23 s to judge each trial's 256 KiB-4 MiB outputs
    (0.73 s the first, which also carries the determinism and float64 checks) while eight
    evaluations built and waited beside it (bench/experiment.py --trace, 2026-12-06): a team of
    16 OpenMP threads floating over cores that builds keep busy waits at every barrier for its
    slowest thread. With one thread on the timer core the harness judged 36 trial messages in
    0.72 s in all, 0.02 s each (`bench/experiment.py --profile-trials`, the H100 at 177bcbe,
    2026-12-06)."""
    from kloop.evaluator.harness import cores

    if cores.plan() is None:
        yield
        return
    with cores.timing_thread(), one_cpu_thread():
        yield
