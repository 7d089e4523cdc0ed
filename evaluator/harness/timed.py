"""The candidate's timed calls: every one checked against the reference's output for its seed,
every one timed by the harness's clock (`evaluator.harness.clock`)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from kloop.evaluator.common.protocol import ROLES, Control, FlagMsg
from kloop.evaluator.common.result import (
    CorrectnessTrial,
    ErrorInfo,
    HeadToHead,
    OutputDiff,
    PairedSummary,
    SpeedupInterval,
    TimingStats,
)
from kloop.evaluator.common.wire import BAD_OUTPUT, OK
from kloop.evaluator.harness.checks import violate
from kloop.evaluator.harness.clock import CallResult, ChannelBroken
from kloop.evaluator.harness.outcome import (
    Compared,
    Decided,
    Entered,
    Failed,
    Flagged,
    Judged,
    Measured,
    Noted,
    Paired,
    violated,
)
from kloop.evaluator.harness.paired import (
    DeviceNotQuiet,
    PairedServed,
    Side,
    busy_beside,
    own_handshake,
    per_call,
    run_paired,
    speedup_interval,
)
from kloop.evaluator.harness.precision import precision_on_call
from kloop.evaluator.harness.served import CallPlan, run_plan, timing_stats
from kloop.evaluator.procs import procwatch

if TYPE_CHECKING:
    from kloop.evaluator.harness.ledger import Ledger
    from kloop.evaluator.harness.state import EvalRun

TIMED_TRIAL_BASE = 1000
_UNSERVED = "the output could not be served"
RESOLUTION_MULTIPLE = 5.0
"""A model whose median is below this many handshakes (the serving overhead of one call) is
flagged `below_clock_resolution`: the overhead is then a fifth of the call or more, and its
jitter a large share of any speedup."""
_FIELDS = {"eager": "eager", "compile": "compiled", "compile_ro": "compiled_ro"}
_RELEASE_S = 60.0


def timed_calls(run: EvalRun, ledger: Ledger, child: Any, seeds: list[int]) -> None:
    """Serve the plan through the child's call channel; measures the timing when every call
    passed, else records the failed call as a `timed` trial (or the error, timeout or
    violation)."""
    ref = run.reference
    assert ref is not None and child.calls is not None
    if ref.layout is None or ref.served is None:
        child.send(Control(next="stop"))
        ledger.record(Failed(error=ErrorInfo(type="NoReferenceCalls",
                                             message="the reference served no calls")))
        return
    layout, store = ref.layout, ref.served
    # Its trials may have run beside other evaluations' outputs-only reference workers; from
    # the first timed call on, nothing else holds the device (`EvalConfig.candidate_hold`).
    run.alone_for_timing(ledger)
    child.calls.set_layout(layout)
    child.calls.spin = not run.on_cpu
    child.send(Control(next="serve", data=layout.model_dump_json()))
    ledger.record(Entered(stage="timing"))
    ledger.mark("timing")
    tol = run.policy.tolerance(run.config.precision)
    failed: list[int] = []

    def fail(i: int, message: str, diffs: list[OutputDiff] | None = None) -> bool:
        failed.append(i)
        # Decided here: whatever the process does next (hang, crash) does not change it.
        ledger.record(Judged(trial=CorrectnessTrial(trial=TIMED_TRIAL_BASE + i, kind="timed",
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
        if not store.passes(i, got, tol):
            # The full comparison decides (the quick test only ever answers "passes" early).
            diffs = store.compare(i, got, tol)
            bad = next((d for d in diffs if not d.ok), None)
            if bad is not None:
                return fail(i, f"timed call {i}: {bad.message}", diffs)
        if i in ref.served64:
            precision_on_call(run, ledger, i, got.tensors(), *ref.served64[i])
        return True

    def incumbent_ok(i: int, r: CallResult) -> bool:
        return r.status == OK and r.output is not None and (
            store.passes(i, r.output, tol) or all(d.ok for d in store.compare(i, r.output, tol)))

    t = run.timing_spec()
    server = run.server
    parked = run.ref_child if ref.parked else None
    baselines = server.channel if server is not None else \
        parked.calls if parked is not None else None
    dropped: dict[str, str] = {}
    cpu0 = procwatch.cpu_seconds(child.proc.pid)
    if server is not None:
        server.begin()
    try:
        if baselines is not None:
            sides = _sides(run, child, baselines)
            if (inc := run.incumbent_child) is not None:
                assert inc.calls is not None
                inc.calls.set_layout(layout)
                inc.calls.spin = not run.on_cpu
                inc.send(Control(next="serve", data=layout.model_dump_json()))
                sides.insert(1, Side("incumbent", inc.calls, group=inc.proc.pid))
                sides.append(Side("incumbent_null", inc.calls, null=True, group=inc.proc.pid))
            paired = run_paired(
                sides, seeds, warmup_calls=t.warmup_calls,
                warmup_ms=t.warmup_ms, prep=t.l2_flush, flush_device=t.l2_flusher, gpu=t.gpu,
                budget_s=run.config.timeouts.timing + run.config.timeouts.baselines,
                on_output=on_output, checks={"incumbent": incumbent_ok},
                stop_check=_narrow(run) if run.policy.timing_stop_width is not None and
                run.incumbent_child is None else None)
            dropped = paired.dropped
            if paired.quiet_waits_ms:
                w = paired.quiet_waits_ms
                ledger.record(Flagged(flag=f"baselines_waited_for_device: {len(w)} of the "
                                           f"baselines' {paired.quiet_checks} calls waited "
                                           f"{sum(w):.1f} ms in all for other work on the "
                                           f"device to end first"))
                if busy_beside(len(w), paired.quiet_checks) and _device_busy(
                        run, ledger, child, f"{len(w)} of {paired.quiet_checks} baseline calls "
                                            f"found another process's work on the device first"):
                    return
            # Where the timing stage's wall goes (parts of `timing`, not added to it).
            ledger.clock("timing_warmup", paired.warmup_s)
            ledger.clock("timing_rounds", paired.rounds_s)
            ledger.clock("timing_calls", paired.calls_s)
            for part, seconds in paired.parts_s.items():
                ledger.clock(f"timing_{part}", seconds)
        else:
            plan = CallPlan(seeds=seeds, warmup_calls=t.warmup_calls, warmup_ms=t.warmup_ms,
                            prep=t.l2_flush, flusher=t.l2_flusher, gpu=t.gpu)
            served = run_plan(child.calls, plan, run.config.timeouts.timing, on_output)
    except DeviceNotQuiet as e:
        if not _device_busy(run, ledger, child, str(e)):
            child.kill("decided")  # its rounds stopped short: no timing to record either way
        return
    except ChannelBroken as e:
        child.kill(e.kind)
        if e.kind == "timeout":
            ledger.stop("timeout", "timing", ErrorInfo(
                type="Timeout", message=f"the timed calls ran past their limit of "
                f"{run.config.timeouts.timing:g} s"))
        elif e.kind == "protocol":
            v = violate(run, "protocol_violation", str(e))
            ledger.record(*violated(v))
            if v.severity == "reject":  # decided here: the kill that follows is ours
                ledger.stop("rejected", "timing")
        return
    finally:
        ended = time.monotonic()
        child.calls.stop()
        if run.incumbent_child is not None:  # its part is over: nothing of it is judged after
            from kloop.evaluator.harness.headtohead import end_incumbent

            end_incumbent(run)
        if server is not None:
            server.end(ledger, dropped)
        if parked is not None:
            release_reference(run, ledger)
        ledger.clock("timing_end", time.monotonic() - ended)  # sessions closed, workers parked
    if failed:
        # Decided: what the process would do next (profile, hang) changes nothing.
        child.kill("decided")
        return
    if baselines is not None:
        _cpu_use(run, ledger, child, cpu0, paired.busy_ms.get("candidate", 0.0) / 1000.0)
        t0 = time.monotonic()
        _record_paired(run, ledger, paired, paired.calls_run,
                       [x.name for x in sides if x.name in _FIELDS])
        ledger.clock("timing_record", time.monotonic() - t0)  # statistics and intervals
        return
    if len(served.wall_ms) < len(seeds):
        return
    # The worker's own events are never believed alone: they ride along bounded by the
    # reference worker's serving overhead (`served.bounded_events`), which only the
    # `kernelbench` policy divides (`Policy.timing_of_record`). Taken off: the reference
    # worker's fastest null call only; nothing the candidate's process measures.
    ledger.record(Measured(what="timing", stats=timing_stats(
        served, ref.handshake_ms, on_cuda=not run.on_cpu, null_call_ms=ref.null_call_ms,
        calibrated_overhead_ms=ref.calibrated_overhead_ms, event_bound=ref.event_bound_ms)))


def _device_busy(run: EvalRun, ledger: Ledger, child: Any, why: str) -> bool:
    """Record `device_busy_beside_baselines`; True when the policy rejects for it (decided
    here: the child is ended)."""
    v = violate(run, "device_busy_beside_baselines", why)
    ledger.record(*violated(v))
    if v.severity != "reject":
        return False
    ledger.stop("rejected", "timing")
    child.kill("decided")
    return True


def _sides(run: EvalRun, child: Any, baselines: Any) -> list[Side]:
    """The candidate, each baseline the baselines' worker serves (`baselines`: its channel),
    and both processes' null calls."""
    group = child.proc.pid  # the child leads its own process group (the sandbox's session)
    sides = [Side("candidate", child.calls, group=group),
             Side("candidate_null", child.calls, null=True, group=group)]
    for name in paired_roles(run):
        sides.append(Side(name, baselines, role=ROLES[name]))
    sides.append(Side("null", baselines, null=True))
    return sides


def paired_roles(run: EvalRun) -> list[str]:
    """The baselines of the paired rounds: those the kept worker serves (`run.server`), else
    those the evaluation's own reference worker served without failing (or has from the
    cache)."""
    if run.server is not None:
        return list(run.server.roles)
    assert run.reference is not None
    return run.reference.paired_roles


def _record_paired(run: EvalRun, ledger: Ledger, paired: PairedServed, n_seeds: int,
                   roles: list[str]) -> None:
    """The numbers of record from the rounds, each speedup with its interval over the rounds.
    A baseline's calls are net of the reference worker's fastest null call of these rounds, a
    candidate's of the fastest of those and its own process's (`own_handshake`)."""
    from kloop.evaluator.harness.state import (
        speedup_clock,  # the clock rule lives with the speedups
    )

    ref = run.reference
    assert ref is not None
    cand = paired.sides.get("candidate")
    nulls = paired.sides.get("null")
    if cand is None or len(cand.wall_ms) < n_seeds:
        return
    hs, hs_cand = _handshakes(paired, ref.handshake_ms)
    null_ms = nulls.null_median_ms() if nulls is not None else ref.null_call_ms
    on_cuda = not run.on_cpu

    def stats(name: str, handshake: float | None) -> TimingStats | None:
        served = paired.sides.get(name)
        if served is None or not served.wall_ms:
            return None
        return timing_stats(served, handshake, on_cuda=on_cuda, null_call_ms=null_ms,
                            calibrated_overhead_ms=ref.calibrated_overhead_ms,
                            event_bound=ref.event_bound_ms)

    timing = stats("candidate", hs_cand)
    ledger.record(Measured(what="timing", stats=timing))
    measured: dict[str, TimingStats] = {}
    for name in roles:
        st = stats(name, hs)
        if st is None:
            why = paired.dropped.get(name, "not timed")
            ledger.record(Flagged(flag=f"paired_baseline_dropped: {name}: {why}"))
            continue
        measured[name] = st.model_copy(update={"measured_as": "reference"})
        ledger.record(Measured(what=_FIELDS[name], stats=measured[name]))  # type: ignore[arg-type]
    clock = speedup_clock(run.policy, timing, measured.get("eager")) or "harness"
    stat = run.policy.speedup_stat
    c = per_call(cand, hs_cand, clock, ref.event_bound_ms)
    intervals = {
        name: SpeedupInterval(low=lo, high=hi, level=0.95, rounds=len(
            set(paired.rounds["candidate"]) & set(paired.rounds[name])))
        for name, (lo, hi) in _intervals(paired, list(measured), c, hs, clock,
                                         ref.event_bound_ms, stat).items()}
    if run.incumbent is not None:
        ledger.record(Compared(head_to_head=_head_to_head(run, paired, c, hs, clock, stat)))
    eager = measured.get("eager")
    multiple = eager.median_ms / hs if eager is not None and hs else None
    ledger.record(Paired(summary=PairedSummary(
        rounds=paired.n_rounds, calls_per_round=paired.calls_per_round, plan=run.plan,
        stopped_early=paired.stopped_early, width_at_check=paired.width_at_check,
        handshake_ms=hs,
        baselines=list(measured), resolution_multiple=multiple,
        unpaired_eager_ms=ref.eager.median_ms if ref.eager is not None else None),
        intervals=intervals))
    if hs and timing is not None and on_cuda and (
            timing.median_ms < RESOLUTION_MULTIPLE * hs or
            (eager is not None and eager.median_ms < RESOLUTION_MULTIPLE * hs)):
        ledger.record(Flagged(flag=f"below_clock_resolution: a median under {RESOLUTION_MULTIPLE:g}x "
                                   f"the serving overhead of {hs:.3f} ms"))


def _narrow(run: EvalRun) -> Callable[[PairedServed], bool]:
    """The sequential rule's test (`Policy.timing_stop_width`): every baseline the rounds still
    time has a speedup interval, on the trusted clock and the policy's statistic, narrower than
    the width's share of its midpoint. Computed as the record computes them, from these rounds'
    calls net of these rounds' handshakes."""
    width, stat = run.policy.timing_stop_width, run.policy.speedup_stat
    assert width is not None and run.reference is not None
    fallback_hs = run.reference.handshake_ms

    def narrow(paired: PairedServed) -> bool:
        cand = paired.sides.get("candidate")
        names = [n for n in paired.sides if n in _FIELDS and n not in paired.dropped]
        if cand is None or not names:
            return False
        hs, hs_cand = _handshakes(paired, fallback_hs)
        cis = _intervals(paired, names, per_call(cand, hs_cand, "harness", None), hs, "harness",
                         None, stat)
        if len(cis) < len(names) or any(lo + hi <= 0 for lo, hi in cis.values()):
            return False
        paired.width_at_check = max((hi - lo) / ((hi + lo) / 2) for lo, hi in cis.values())
        return paired.width_at_check <= width

    return narrow


def _handshakes(paired: PairedServed, fallback_ms: float | None) -> tuple[float | None,
                                                                         float | None]:
    """What the rounds' calls are net of: a baseline's, the reference worker's fastest null call
    of these rounds (its start's where it made none); the candidate's, the fastest of that and
    its own process's (`own_handshake`)."""
    nulls = paired.sides.get("null")
    hs = nulls.handshake_ms() if nulls is not None else fallback_ms
    return hs, own_handshake(hs, paired.sides.get("candidate_null"))


def _intervals(paired: PairedServed, names: list[str], cand_ms: Any, hs: float | None,
               clock: str, bound_ms: float | None, stat: str) -> dict[str, tuple[float, float]]:
    """Each named baseline's speedup interval over the rounds both it and the candidate ran
    (`cand_ms`: the candidate's calls on `clock`); a baseline without one is left out."""
    out = {}
    for name in names:
        ci = speedup_interval(cand_ms, paired.rounds["candidate"],
                              per_call(paired.sides[name], hs, clock, bound_ms),
                              paired.rounds[name], stat)
        if ci is not None:
            out[name] = ci
    return out


def _head_to_head(run: EvalRun, paired: PairedServed, c: Any, hs: float | None, clock: str,
                  stat: str) -> HeadToHead:
    """The incumbent's time over the challenger's, from the same rounds, on the speedups' clock
    and statistic, with its interval; void (ratio None) where the incumbent did not serve every
    round or served a wrong output."""
    import hashlib

    import numpy as np

    ref = run.reference
    assert ref is not None and run.incumbent is not None
    sha = hashlib.sha256(run.incumbent.encode()).hexdigest()
    inc = paired.sides.get("incumbent")
    if inc is None or len(inc.wall_ms) != len(paired.sides["candidate"].wall_ms):
        why = paired.dropped.get("incumbent", "it did not serve (see the flags)")
        return HeadToHead(ratio=None, incumbent_sha256=sha, note=f"void: {why}")
    i = per_call(inc, own_handshake(hs, paired.sides.get("incumbent_null")), clock,
                 ref.event_bound_ms)
    f = np.median if stat == "median" else np.mean
    ratio = float(f(i) / f(c)) if f(c) > 0 else None
    ci = speedup_interval(c, paired.rounds["candidate"], i, paired.rounds["incumbent"], stat)
    return HeadToHead(ratio=ratio, low=ci[0] if ci else None, high=ci[1] if ci else None,
                      rounds=paired.n_rounds, incumbent_sha256=sha,
                      note="host clock: not comparable with GPU numbers" if run.on_cpu else None)


def _cpu_use(run: EvalRun, ledger: Ledger, child: Any, cpu0: float | None,
             wall_s: float) -> None:
    """On CPU: the candidate process's CPU time over its calls' wall time, read by the harness
    from /proc (whatever the process set for itself: `torch.set_num_threads`, a helper thread
    started and joined inside each call). Above its thread allotment it computed on more cores
    than every other CPU evaluation gets: flagged, with the ratio."""
    cpu1 = procwatch.cpu_seconds(child.proc.pid)
    if not run.on_cpu or cpu0 is None or cpu1 is None:
        return
    # /proc counts CPU time in ticks (10 ms): too little wall time reads as nothing.
    if wall_s < 0.5:
        return
    ratio = (cpu1 - cpu0) / wall_s
    if ratio > 1.5 * run.config.cpu_threads + 0.25:
        ledger.record(Flagged(flag=f"cpu_threads_exceeded: {ratio:.1f} cores busy per call, "
                                   f"{run.config.cpu_threads} allotted"))


def release_reference(run: EvalRun, ledger: Ledger) -> None:
    """Stop the parked reference worker and collect what it said while serving the rounds (a
    baseline that failed there); killed if it does not end in time."""
    child = run.ref_child
    if child is None:
        return
    run.ref_child = None
    assert child.calls is not None
    child.calls.stop()
    timer = threading.Timer(_RELEASE_S, child.kill, args=("timeout",))
    timer.start()
    try:
        for msg in child.messages():
            if isinstance(msg, FlagMsg):
                ledger.record(Flagged(flag=msg.flag))
        child.outcome()
    finally:
        timer.cancel()


def note_call_problem(ledger: Ledger, message: str) -> None:
    """The worker's account of why its output could not be served, on the failed call."""
    for t in ledger.verdict.trials:
        if t.kind == "timed" and t.message == _UNSERVED:
            ledger.record(Noted(trial=t.trial, message=f"{_UNSERVED}: {message[:500]}"))
            return
