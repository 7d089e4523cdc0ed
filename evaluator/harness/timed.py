"""The candidate's timed calls: every one checked against the reference's output for its seed,
every one timed by the harness's clock (`evaluator.harness.clock`)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from evaluator.checks import violate
from evaluator.harness.clock import CallResult, ChannelBroken
from evaluator.harness.served import CallPlan, null_call_count, run_plan, timing_stats
from evaluator.outcome import Decided, Entered, Failed, Judged, Measured, Noted, violated
from evaluator.protocol import Control
from evaluator.result import CorrectnessTrial, ErrorInfo, OutputDiff
from evaluator.worker.serve import BAD_OUTPUT, OK

if TYPE_CHECKING:
    from evaluator.state import EvalRun

TIMED_TRIAL_BASE = 1000
_UNSERVED = "the output could not be served"


def timed_calls(run: EvalRun, child: Any, seeds: list[int]) -> None:
    """Serve the plan through the child's call channel; sets `run.timing` when every call
    passed, else records the failed call as a `timed` trial (or the error, timeout or
    violation)."""
    ref = run.reference
    assert ref is not None and child.calls is not None
    if ref.layout is None or ref.served is None:
        child.send(Control(next="stop"))
        run.record(Failed(error=ErrorInfo(type="NoReferenceCalls",
                                          message="the reference served no calls")))
        return
    layout, store = ref.layout, ref.served
    child.calls.set_layout(layout)
    child.calls.spin = not run.on_cpu
    child.send(Control(next="serve", data=layout.model_dump_json()))
    run.record(Entered(stage="timing"))
    run.mark("timing")
    tol = run.policy.tolerance(run.config.precision)
    failed: list[int] = []

    def fail(i: int, message: str, diffs: list[OutputDiff] | None = None) -> bool:
        failed.append(i)
        # Decided here: whatever the process does next (hang, crash) does not change it.
        run.record(Judged(trial=CorrectnessTrial(trial=TIMED_TRIAL_BASE + i, kind="timed",
                                                 passed=False, outputs=diffs or [],
                                                 message=message)),
                   Decided(status="incorrect", stage="timing"))
        return False

    def on_output(i: int, r: CallResult) -> bool:
        if r.status == BAD_OUTPUT:
            return fail(i, _UNSERVED)
        if r.status != OK:
            failed.append(i)  # it raised: the worker's error message says what
            return False
        if r.output is None:
            return fail(i, "the shared output memory was cut short")
        got = r.output
        if store.passes(i, got, tol):
            return True
        # The full comparison decides (the quick test only ever answers "passes" early).
        diffs = store.compare(i, got, tol)
        bad = next((d for d in diffs if not d.ok), None)
        return True if bad is None else fail(i, f"timed call {i}: {bad.message}", diffs)

    t = run.timing_spec()
    plan = CallPlan(seeds=seeds, warmup_calls=t.warmup_calls, warmup_ms=t.warmup_ms,
                    null_calls=null_call_count(run.on_cpu, len(seeds)),
                    prep=t.l2_flush, flusher=t.l2_flusher, gpu=t.gpu)
    try:
        served = run_plan(child.calls, plan, run.config.timeouts.timing, on_output)
    except ChannelBroken as e:
        child.kill(e.kind)
        if e.kind == "timeout":
            run.stop("timeout", "timing", ErrorInfo(
                type="Timeout", message=f"the timed calls ran past their limit of "
                f"{run.config.timeouts.timing:g} s"))
        elif e.kind == "protocol":
            v = violate(run, "protocol_violation", str(e))
            run.record(*violated(v))
            if v.severity == "reject":  # decided here: the kill that follows is ours
                run.stop("rejected", "timing")
        return
    finally:
        child.calls.stop()
    if failed:
        # Decided: what the process would do next (profile, hang) changes nothing.
        child.kill("decided")
        return
    if len(served.wall_ms) < len(seeds):
        return
    # The worker's own events are never believed alone: they ride along bounded by the
    # reference worker's serving overhead (`served.bounded_events`), which only the
    # `kernelbench` policy divides (`Policy.timing_of_record`).
    run.record(Measured(what="timing", stats=timing_stats(
        served, handshake(ref.handshake_ms, served.handshake_ms()), on_cuda=not run.on_cpu,
        null_call_ms=ref.null_call_ms, calibrated_overhead_ms=ref.calibrated_overhead_ms,
        event_bound=ref.event_bound_ms)))


def handshake(reference_ms: float | None, session_ms: float | None) -> float | None:
    """What is taken off each of the candidate's calls: the fastest null call of the reference
    worker's session or of the candidate's own, whichever is faster. The reference's was
    measured earlier, under whatever load the host had then, and a handshake inflated by load
    takes a call below its work (on the H200, with 8 evaluations and builds at once, a 20 ms
    call read 19.46 ms); the session's own bounds it now. A candidate's process can only make
    its own null calls faster, and so its own numbers larger, never a speedup."""
    known = [h for h in (reference_ms, session_ms) if h is not None]
    return min(known) if known else None


def note_call_problem(run: EvalRun, message: str) -> None:
    """The worker's account of why its output could not be served, on the failed call."""
    for t in run.trials:
        if t.kind == "timed" and t.message == _UNSERVED:
            run.record(Noted(trial=t.trial, message=f"{_UNSERVED}: {message[:500]}"))
            return
