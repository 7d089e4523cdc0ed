"""The reference worker's harness side and the baseline cache (the worker itself is
`evaluator.worker.reference_worker`).

`collect_reference` drives it: the eager model's served calls give the handshake
(null calls), the eager baseline and the reference's output for every timed call's seed; the
compiled baselines (torch.compile in its default mode, `compile`, and in mode="reduce-overhead",
`compile_ro`) are cached per problem hash + device + versions + policy + timing settings, in
the harness-private cache, with the flags the worker raised while serving them: a compiled
baseline that failed is not served again until the record is rebuilt (`kloop baseline`).
Expected outputs are loaded into memory and their files deleted before any candidate process
starts.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import secrets
import tempfile
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import torch
from pydantic import BaseModel, ConfigDict, Field

from kloop.evaluator.common.protocol import (
    ROLES,
    Control,
    DoneMsg,
    EnvMsg,
    ErrorMsg,
    FlagMsg,
    ReferenceJob,
    ServeMsg,
    StageMsg,
    TimingSpec,
)
from kloop.evaluator.common.result import EnvInfo, ErrorInfo, TimingStats
from kloop.evaluator.common.sample import Float64Outputs
from kloop.evaluator.common.wire import OK, ServeLayout
from kloop.evaluator.harness.clock import CallResult, ChannelBroken
from kloop.evaluator.harness.expected import ExpectedStore
from kloop.evaluator.harness.served import (
    CallPlan,
    Served,
    event_bound_ms,
    overhead_ms,
    run_plan,
    timing_stats,
)
from kloop.evaluator.procs.sandbox import Child, ChildOutcome

log = logging.getLogger(__name__)
BASELINE_SCHEMA_VERSION = 3
COMPILED = {"compile": "compiled", "compile_ro": "compiled_ro"}
"""The compiled baselines' roles and the fields that keep their timings."""


class ReferenceFailure(RuntimeError):
    """The reference itself could not be built or run: an infrastructure fault, never the
    candidate's. Carries what the worker reported."""

    def __init__(self, message: str, error: ErrorInfo | None = None, stderr_tail: str = ""):
        super().__init__(message)
        self.error = error
        self.stderr_tail = stderr_tail


class BaselineRecord(BaseModel):
    """One cached set of baseline timings (absent ones are None); records of schema 2 (no
    `compiled_ro`, no `flags`) read as records whose reduce-overhead baseline is not measured
    yet."""

    model_config = ConfigDict(extra="forbid")

    schema_version: int = BASELINE_SCHEMA_VERSION
    key: str
    key_fields: dict[str, Any]
    eager: TimingStats | None = None
    compiled: TimingStats | None = None
    compiled_ro: TimingStats | None = None
    flags: dict[str, list[str]] = Field(default_factory=dict)
    """Compiled role -> the flags the worker raised while serving it (`baseline_compile_ro_
    failed: ...`, `baseline_compile_ro_no_cudagraphs: ...`), raised again whenever the record
    is read."""
    env: EnvInfo
    updated_at: str

    def settled(self, role: str) -> bool:
        """Whether the compiled baseline `role` was measured, or failed, already."""
        return getattr(self, COMPILED[role]) is not None or any(
            f.startswith(f"baseline_{role}_failed") for f in self.flags.get(role, []))


def timing_key(timing: TimingSpec) -> dict[str, Any]:
    """How calls are timed, for a baseline's key: not which GPU of the host (`gpu`), and new
    fields only when set (keys made before they existed stay valid)."""
    return timing.model_dump(exclude={"gpu"}, exclude_none=True)


def baseline_key(fields: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(fields, sort_keys=True, default=str).encode()).hexdigest()


def atomic_write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-")
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.replace(tmp, path)


# ---- harness side ---------------------------------------------------------------------------


@dataclass
class ReferenceOutput:
    """What the harness keeps from the reference worker."""

    env: EnvInfo | None = None
    expected: dict[int, list[Any]] = field(default_factory=dict)
    """The probe trials' expected outputs, by trial index; each is taken out when its trial is
    judged."""
    expected64: dict[int, Float64Outputs] = field(default_factory=dict)
    """float64 outputs of the trials that carry the precision check."""
    served: ExpectedStore | None = None
    """The reference's outputs of the timed calls (one per seed of `Serving.seeds`)."""
    layout: ServeLayout | None = None
    handshake_ms: float | None = None
    """The fastest null call of the reference worker: taken off every call of the candidate and
    the baselines (a lower bound of serving a call, so no number is ever made smaller than the
    work)."""
    null_call_ms: float | None = None
    calibrated_overhead_ms: float | None = None
    """`served.overhead_ms` of the eager calls: for the calibrated estimate only."""
    event_bound_ms: float | None = None
    """`served.event_bound_ms` of the eager calls: how far below its wall time (less the
    bound) no call's events are believed, the reference's and the candidate's alike."""
    eager: TimingStats | None = None
    compiled: TimingStats | None = None
    compiled_ro: TimingStats | None = None
    flags: list[str] = field(default_factory=list)
    served_roles: dict[str, list[str]] = field(default_factory=dict)
    """The compiled roles served in this session (not read from the cache) -> the flags the
    worker raised while serving each."""
    wall_s: float = 0.0
    stage_seconds: dict[str, float] = field(default_factory=dict)
    """Wall time of the worker's stages (`ref_reference`, `ref_baselines`)."""
    served64: dict[int, tuple[Float64Outputs, float | None]] = field(default_factory=dict)
    """Timed call index -> its float64 outputs and the fp32 reference's own relative error
    (the precision check on timed calls)."""
    parked: bool = False
    """The worker is alive and serves every role on demand (`ReferenceJob.paired`)."""
    paired_roles: list[str] = field(default_factory=list)
    """The roles it serves there: eager, and each compiled baseline that did not fail."""


@dataclass
class Serving:
    """How the harness drives the reference worker's served calls."""

    seeds: list[int]
    """The timed calls' secret seeds; the candidate is called on the same ones."""
    timing: TimingSpec
    on_cuda: bool
    budget_s: float
    null_calls: int
    cache_dir: Path | None
    """Baseline records (harness-private); None: no cache."""
    key_extra: dict[str, Any]
    rebuild: bool = False
    outputs_only: bool = False
    """The eager calls are made for their outputs only (a shared hold, `EvalConfig.
    reference_hold`): no preparation, null calls or warm-up, and nothing measured is kept
    (a kept worker's start measured the baselines alone)."""
    warm_only: bool = False
    """Each role is served `WARM_ONLY_CALLS` calls to compile and warm it, and nothing is
    measured or stored (a kept worker's start under a shared hold, `EvalConfig.
    baseline_start_hold`: its timed calls come after, alone, `servers.time_roles`). A compiled
    role that failed before is skipped as always; one the cache has a timing for is still
    served, since its compile is what this is for."""


WARM_ONLY_CALLS = 2


def collect_reference(child: Child, job: ReferenceJob, serving: Serving | None) -> ReferenceOutput:
    """Drive a started reference worker to the end; raise `ReferenceFailure` if it fails."""
    out = ReferenceOutput()
    error: ErrorInfo | None = None
    done = False
    mark: tuple[str, float] | None = None
    role: str | None = None  # the role served now: the flags raised before the next are its
    last = job.roles()[-1]
    for msg in child.messages():
        if isinstance(msg, StageMsg | DoneMsg) and mark is not None:
            out.stage_seconds[f"ref_{mark[0]}"] = round(time.monotonic() - mark[1], 3)
        if isinstance(msg, StageMsg) and msg.stage == "paired":
            if error is None and out.served is not None:
                out.parked = True  # it stays, serving on demand; its end is the harness's
                out.paired_roles = [r for r in job.roles()
                                    if r == "eager" or getattr(out, COMPILED[r]) is not None]
                done = True
                break
        if isinstance(msg, StageMsg):
            mark = (msg.stage, time.monotonic())
        elif isinstance(msg, EnvMsg):
            out.env = msg.env
        elif isinstance(msg, ServeMsg):
            role = msg.role
            if serving is None or error is not None:
                child.send(Control(next="skip"))
            else:
                _serve(child, msg, serving, out, last=msg.role == last and not job.paired)
        elif isinstance(msg, FlagMsg):
            out.flags.append(msg.flag)
            if role in out.served_roles:
                out.served_roles[role].append(msg.flag)
        elif isinstance(msg, ErrorMsg):
            error = msg.error
        elif isinstance(msg, DoneMsg):
            done = True
    if not out.parked:
        outcome = child.outcome()
        out.wall_s = outcome.wall_s
        if not done or error is not None:
            raise ReferenceFailure(_failure_text(outcome, error), error, outcome.stderr_tail)
    if serving is not None and out.served_roles and not serving.warm_only:
        record, path = cache_record(serving, out)
        store_record(path, record, out, serving)  # with their flags, which came after their calls
    for t in job.trials:
        # Read into memory and the file gone before the candidate runs: a device host has more
        # memory than disk (128 GiB and 64 GiB), and L3/17's six are 26 GB beside the
        # candidate's own seven on disk (an H100 run at 45017da mapped them from their files
        # instead: its disk peaked at 59 of 63 GB). Each is dropped once judged.
        out.expected[t.index] = torch.load(t.expected_path, weights_only=True)
        os.unlink(t.expected_path)
        if t.fp64_path is not None and os.path.exists(t.fp64_path):
            out.expected64[t.index] = Float64Outputs.load(
                torch.load(t.fp64_path, weights_only=True), t.fp64_sample)
            os.unlink(t.fp64_path)
    for s in job.served64:
        if os.path.exists(s.path):
            got = torch.load(s.path, weights_only=True)
            out.served64[s.index] = (Float64Outputs.load(got, s.sample), got["reference_rel_err"])
            os.unlink(s.path)
    return out


def _serve(child: Child, msg: ServeMsg, serving: Serving, out: ReferenceOutput,
           last: bool) -> None:
    assert child.calls is not None
    layout = ServeLayout.of(msg.outputs)
    child.calls.set_layout(layout)
    child.calls.spin = serving.on_cuda and not serving.outputs_only
    out.layout = layout
    record, path = cache_record(serving, out)
    timed_before = record is not None and msg.role in COMPILED and \
        getattr(record, COMPILED[msg.role]) is not None
    if msg.role in COMPILED and record is not None and record.settled(msg.role) and not (
            serving.warm_only and timed_before):
        setattr(out, COMPILED[msg.role], getattr(record, COMPILED[msg.role]))
        out.flags += record.flags.get(msg.role, [])
        child.send(Control(next="skip"))
        return
    child.send(Control(next="serve", data=layout.model_dump_json()))
    eager = msg.role == "eager"
    if eager:
        out.served = ExpectedStore(0 if serving.warm_only else len(serving.seeds))
    failed: list[int] = []

    def on_output(i: int, r: CallResult) -> bool:
        if r.status != OK or r.output is None:
            failed.append(i)
            return False
        if eager and out.served is not None:
            out.served.add(i, r.output)
        return True

    if serving.warm_only:
        plan = CallPlan(seeds=[], warmup_calls=WARM_ONLY_CALLS, warmup_ms=0.0, prep=False)
    elif serving.outputs_only:
        plan = CallPlan(seeds=serving.seeds, warmup_calls=0, warmup_ms=0.0, prep=False)
    else:
        plan = timed_plan(serving, msg.role, serving.seeds if eager else None)
    try:
        served = run_plan(child.calls, plan, serving.budget_s, on_output,
                          timed=not serving.outputs_only)
    except ChannelBroken as e:
        child.kill(e.kind)
        raise ReferenceFailure(f"the reference worker's {msg.role} calls failed: {e}") from None
    finally:
        child.calls.stop(last=last)  # else more roles come on this channel
    if not eager:
        out.served_roles[msg.role] = []
    if failed or len(served.wall_ms) < len(plan.seeds):
        return  # the worker reported why (an error for eager, a flag for the others)
    if serving.outputs_only or serving.warm_only:
        return  # its caller takes the numbers from a kept worker's start, or times them later
    measured(out, msg.role, served, serving.on_cuda)
    if eager:
        store_record(path, record, out, serving)  # `kloop baseline` lists what was measured


def timed_plan(serving: Serving, role: str, seeds: list[int] | None = None,
               by_role: bool = False) -> CallPlan:
    """How `role`'s calls are timed: the timing settings' warm-up and preparation, the null
    calls (the handshake) with eager's; on `seeds`, or as many fresh ones (a baseline whose
    outputs nobody reads). `by_role`: the role byte named in each request (a parked worker)."""
    t = serving.timing
    return CallPlan(
        seeds=seeds if seeds is not None else [secrets.randbits(62) for _ in serving.seeds],
        warmup_calls=t.warmup_calls, warmup_ms=t.warmup_ms,
        null_calls=serving.null_calls if role == "eager" else 0, prep=t.l2_flush,
        flusher=t.l2_flusher, gpu=t.gpu, role=ROLES[role] if by_role else 0)


def measured(out: ReferenceOutput, role: str, served: Served, on_cuda: bool) -> None:
    """`role`'s numbers from its served calls, into `out`: eager first (its null calls give the
    handshake and the bounds every role's numbers use)."""
    if role == "eager":
        out.null_call_ms = served.null_median_ms()
        out.handshake_ms = served.handshake_ms()
        out.calibrated_overhead_ms = overhead_ms(served)
        out.event_bound_ms = event_bound_ms(served, out.handshake_ms)
        out.eager = timing_stats(served, out.handshake_ms, on_cuda=on_cuda,
                                 null_call_ms=out.null_call_ms,
                                 calibrated_overhead_ms=out.calibrated_overhead_ms,
                                 event_bound=out.event_bound_ms)
    else:
        setattr(out, COMPILED[role], timing_stats(
            served, out.handshake_ms, on_cuda=on_cuda, null_call_ms=out.null_call_ms,
            calibrated_overhead_ms=out.calibrated_overhead_ms, event_bound=out.event_bound_ms))


def key_fields(serving: Serving, env: EnvInfo) -> dict[str, Any]:
    return {
        "device": env.device_name, "gpu_arch": env.gpu_arch, "torch": env.torch,
        # "+events": records carry bounded events (a compiled baseline from before is measured
        # again rather than divided on another clock than the eager one).
        "cuda": env.cuda, "timing": timing_key(serving.timing), "clock": "harness+events",
        "n_calls": len(serving.seeds), **serving.key_extra,
    }


def cache_record(serving: Serving, out: ReferenceOutput) -> tuple[BaselineRecord | None, Path | None]:
    if serving.cache_dir is None or out.env is None:
        return None, None
    fields = key_fields(serving, out.env)
    key = baseline_key(fields)
    path = serving.cache_dir / f"{key}.json"
    if serving.rebuild or not path.exists():
        return None, path
    try:
        return BaselineRecord.model_validate_json(path.read_text()), path
    except ValueError:
        return None, path


def store_record(path: Path | None, record: BaselineRecord | None, out: ReferenceOutput,
           serving: Serving) -> None:
    if path is None or out.env is None:
        return
    fields = key_fields(serving, out.env)
    # A compiled baseline measured (or failed) earlier is kept until it is served again.
    timings = {f: getattr(out, f) or (getattr(record, f) if record is not None else None)
               for f in COMPILED.values()}
    flags = dict(record.flags) if record is not None else {}
    flags.update(out.served_roles)
    new = BaselineRecord(key=baseline_key(fields), key_fields=fields, env=out.env,
                         eager=out.eager, **timings, flags={r: f for r, f in flags.items() if f},
                         updated_at=datetime.now(timezone.utc).isoformat())
    atomic_write(path, new.model_dump_json(indent=1))


def _failure_text(outcome: ChildOutcome, error: ErrorInfo | None) -> str:
    if error is not None:
        return f"reference failed in {outcome.stage}: {error.type}: {error.message}"
    if outcome.killed_for:
        return f"reference worker killed ({outcome.killed_for}) in stage {outcome.stage}"
    how = f"signal {outcome.signal}" if outcome.signal else f"exit code {outcome.returncode}"
    tail = outcome.stderr_tail[-2000:]
    return f"reference worker died ({how}) in stage {outcome.stage}:\n{tail}"
