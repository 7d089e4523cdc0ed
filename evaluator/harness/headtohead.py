"""Two candidates timed against each other in one hold of the device: the head-to-head.

When a search must decide between a new kernel and the best so far and their speedup intervals
overlap, dividing two numbers measured in two evaluations does not settle it. `head_to_head`
judges the challenger as any evaluation does, and serves the incumbent beside it in a second
candidate child: the incumbent's calls join the paired rounds (`harness.paired`) as one more
side, on the same seeds, checked against the same expected outputs. The result's
`head_to_head` is the incumbent's time over the challenger's with its interval over rounds
(above 1: the challenger is faster).

The incumbent is hostile code like the challenger: its child is contained the same way, and each
child's directory is covered in the other's mount namespace. Its process lives only inside one
hold of the device that lasts from its start to the challenger's child's end (`one_hold`): a
process that waited for its turn off the lock could launch work into another evaluation's
timing. It serves no probe trials (it was
judged before), so every one of its timed outputs is checked, and a wrong one voids the
comparison. Its CUDA builds come from the build store, filed by its own evaluation.
"""

from __future__ import annotations

import contextlib
import hashlib
import shutil
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING

from kloop.evaluator.build import buildstore
from kloop.evaluator.common.protocol import AwaitMsg, CandidateJob, ErrorMsg
from kloop.evaluator.harness.outcome import Flagged
from kloop.evaluator.procs.isolation import write_new

if TYPE_CHECKING:
    from kloop.evaluator.harness.ledger import Ledger
    from kloop.evaluator.harness.state import EvalRun

STAGES = ["load", "correctness", "timing", "profile", "compile"]


@contextlib.contextmanager
def one_hold(run: EvalRun, ledger: Ledger) -> Iterator[None]:
    """With an incumbent on a GPU: the device lock held from before the incumbent's child starts
    to after it is gone, the challenger's children inside (`EvalRun.held_throughout`), timed as
    `head_to_head_held`. The processes' starts are under it too: the price of never leaving a
    hostile process alive off the lock."""
    if run.incumbent is None or run.held_throughout:
        yield
        return
    from kloop.evaluator.procs import board

    t0 = time.monotonic()
    with contextlib.ExitStack() as held:  # unwound last in, first out
        with board.phase("device_wait"):
            held.enter_context(run.gpu_lock())
        got = time.monotonic()
        ledger.clock("device_wait", got - t0)
        held.callback(lambda: ledger.clock("head_to_head_held", time.monotonic() - got))
        held.callback(end_incumbent, run)  # gone before the lock is given back
        held.callback(setattr, run, "held_throughout", False)
        run.held_throughout = True
        with board.phase("device"):
            yield


def end_incumbent(run: EvalRun) -> None:
    """The incumbent's child killed and reaped (its device work gone with its process)."""
    child, run.incumbent_child = run.incumbent_child, None
    if child is not None:
        child.kill("decided")
        child.outcome()


def start_incumbent(run: EvalRun, ledger: Ledger, job: CandidateJob, env: dict[str, str]) -> None:
    """Start the incumbent's child, under the lock for its load (`one_hold`), waiting to serve
    in `run.kept`; `run.incumbent_child` is set when it is ready to serve, and a flag says why
    not otherwise."""
    assert run.incumbent is not None
    inc = run.root / "inc"
    inc.mkdir(exist_ok=True)
    write_new(inc / "candidate.py", run.incumbent)
    sha = hashlib.sha256(run.incumbent.encode()).hexdigest()
    buildstore.Store(run.config.cache_dir, sha, run.sandbox).stage(inc / "ext", inc / "checks")
    fills = None
    if job.fills_path is not None:  # strict's construction fills, in its own dir
        fills = str(inc / "fills_main.pt")
        shutil.copyfile(job.fills_path, fills)
    inc_job = job.model_copy(update={
        "candidate_path": str(inc / "candidate.py"), "trials": [], "build_dir": str(inc / "ext"),
        "fills_path": fills, "construct_ahead": False, "profile": False, "ncu": False})
    with run.on_device(ledger, "candidate", inc_job, inc, STAGES, env, serves=True, keep=True,
                       mask=[run.root / "cand"]) as child:
        for msg in child.messages():
            if isinstance(msg, AwaitMsg):
                run.incumbent_child = child
                return
            if isinstance(msg, ErrorMsg):
                why = f"{msg.error.type}: {msg.error.message[:200]}"
                ledger.record(Flagged(flag=f"head_to_head_unavailable: the incumbent failed to "
                                           f"load ({why})"))
                child.kill("decided")
                child.outcome()
                return
    ledger.record(Flagged(flag="head_to_head_unavailable: the incumbent ended before it served"))
