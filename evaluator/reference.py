"""The reference worker and the baseline cache.

Worker side (`run_reference`, inside a child): build the reference `Model` the KernelBench way,
draw each correctness trial's inputs from its salted seed, compute the expected outputs under
`no_grad`, write inputs (for the candidate) and expected outputs (harness-private) to disk, and
time the eager and torch.compile baselines with `evaluator.timing.time_callable`, cached on
disk per problem hash + device + versions + policy + timing settings.

Harness side (`run_reference_worker`): spawn it, collect the results, load the expected outputs
into memory and delete their files before any candidate process starts.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import tempfile
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Literal

import torch
from pydantic import BaseModel, ConfigDict

from evaluator.child import Channel
from evaluator.construct import (
    apply_numerics,
    as_output_list,
    clone_all,
    construct,
    draw_inputs,
    env_info,
    init_inputs,
    load_problem,
    parameter_layout,
    reparam_model,
    scaled_inputs,
    sync,
)
from evaluator.protocol import (
    DoneMsg,
    EnvMsg,
    ErrorMsg,
    FlagMsg,
    ReferenceJob,
    StageMsg,
    TimingMsg,
)
from evaluator.result import EnvInfo, ErrorInfo, TimingStats
from evaluator.sandbox import Child, ChildOutcome
from evaluator.timing import time_callable

log = logging.getLogger(__name__)
BASELINE_SCHEMA_VERSION = 1


class ReferenceFailure(RuntimeError):
    """The reference itself could not be built or run: an infrastructure fault, never the
    candidate's. Carries what the worker reported."""

    def __init__(self, message: str, error: ErrorInfo | None = None, stderr_tail: str = ""):
        super().__init__(message)
        self.error = error
        self.stderr_tail = stderr_tail


class BaselineRecord(BaseModel):
    """One cached pair of baseline timings (absent ones are None)."""

    model_config = ConfigDict(extra="forbid")

    schema_version: int = BASELINE_SCHEMA_VERSION
    key: str
    key_fields: dict[str, Any]
    eager: TimingStats | None = None
    compiled: TimingStats | None = None
    env: EnvInfo
    updated_at: str


# ---- worker side ----------------------------------------------------------------------------


def run_reference(job: ReferenceJob, ch: Channel) -> None:
    spec = job.problem
    apply_numerics(spec.allow_tf32)
    ch.stage("reference")
    try:
        env = env_info(spec.device)
        ch.send(EnvMsg(env=env))
        problem = load_problem(spec)
        model = construct(problem.Model, init_inputs(problem, spec), spec)
        for t in job.trials:
            inputs = draw_inputs(problem, t.input_seed, spec)
            if t.input_scale is not None:
                inputs = scaled_inputs(inputs, t.input_seed, t.input_scale)
            torch.save(_to_cpu(inputs), t.inputs_path)
            trial_model = model if t.perturb_seed is None else _perturbed(problem, spec, t)
            torch.manual_seed(t.forward_seed)
            with torch.no_grad():
                out = trial_model(*clone_all(inputs))
            sync(spec.device)
            torch.save([_to_cpu_one(o) for o in as_output_list(out)], t.expected_path)
            del trial_model
    except BaseException as e:
        ch.error("reference", e, spec.path, "runtime_error")
        return
    if job.baselines and job.timing is not None:
        ch.stage("baselines")
        _baselines(job, model, problem, env, ch)
    ch.send(DoneMsg())


def _perturbed(problem, spec, t) -> torch.nn.Module:
    """The reparam trial's reference model; its parameter layout goes to the candidate, which
    can only take part when its own layout is the same."""
    assert t.perturb_seed is not None and t.layout_path is not None
    model = reparam_model(problem.Model, init_inputs(problem, spec), spec, t.perturb_seed)
    Path(t.layout_path).write_text(json.dumps(parameter_layout(model)))
    return model


def _to_cpu_one(x: Any) -> Any:
    return x.detach().cpu() if isinstance(x, torch.Tensor) else x


def _to_cpu(xs: list[Any]) -> list[Any]:
    return [_to_cpu_one(x) for x in xs]


def baseline_key(fields: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(fields, sort_keys=True, default=str).encode()).hexdigest()


def _baselines(job: ReferenceJob, model, problem, env: EnvInfo, ch: Channel) -> None:
    spec, timing = job.problem, job.timing
    assert timing is not None
    fields = {
        "problem_sha256": spec.sha256, "overrides": spec.overrides, "precision": spec.precision,
        "allow_tf32": spec.allow_tf32, "device": env.device_name, "gpu_arch": env.gpu_arch,
        "torch": env.torch, "cuda": env.cuda, "timing": timing.model_dump(),
        **job.baseline_key_extra,
    }
    key = baseline_key(fields)
    path = Path(job.baseline_cache) / f"{key}.json" if job.baseline_cache else None
    record = None
    if path is not None and path.exists() and not job.rebuild_baselines:
        record = BaselineRecord.model_validate_json(path.read_text())
    record = record or BaselineRecord(key=key, key_fields=fields, env=env, updated_at="")
    sets = [draw_inputs(problem, seed, spec) for seed in timing.input_seeds]
    changed = False
    for name in job.baselines:
        attr = "eager" if name == "eager" else "compiled"
        cached = getattr(record, attr)
        if cached is None:
            cached = _time_baseline(name, model, sets, job, ch)
            if cached is None:
                continue
            setattr(record, attr, cached)
            changed = True
            ch.send(TimingMsg(name=name, stats=cached))
        else:
            ch.send(TimingMsg(name=name, stats=cached, cached=True))
    if changed and path is not None:
        record.updated_at = datetime.now(timezone.utc).isoformat()
        _atomic_write(path, record.model_dump_json(indent=1))


def _time_baseline(name: Literal["eager", "compile"], model, sets, job: ReferenceJob,
                   ch: Channel) -> TimingStats | None:
    timing = job.timing
    assert timing is not None
    try:
        fn = model
        if name == "compile":
            torch._dynamo.reset()
            fn = torch.compile(model)
        return time_callable(
            fn, sets, device=job.problem.device, trials=timing.trials,
            warmup_calls=timing.warmup_calls, warmup_ms=timing.warmup_ms,
            l2_flush=timing.l2_flush,
        )
    except Exception as e:
        # A baseline that cannot be timed leaves its speedup empty; the candidate is unaffected.
        ch.send(FlagMsg(flag=f"baseline_{name}_failed: {type(e).__name__}: {str(e)[:200]}"))
        return None


def _atomic_write(path: Path, text: str) -> None:
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
    eager: TimingStats | None = None
    compiled: TimingStats | None = None
    flags: list[str] = field(default_factory=list)
    wall_s: float = 0.0
    stage_seconds: dict[str, float] = field(default_factory=dict)
    """Wall time of the worker's stages (`ref_reference`, `ref_baselines`)."""


def collect_reference(child: Child, job: ReferenceJob) -> ReferenceOutput:
    """Drive a started reference worker to the end; raise `ReferenceFailure` if it fails."""
    out = ReferenceOutput()
    error: ErrorInfo | None = None
    done = False
    mark: tuple[str, float] | None = None
    for msg in child.messages():
        if isinstance(msg, StageMsg | DoneMsg) and mark is not None:
            out.stage_seconds[f"ref_{mark[0]}"] = round(time.monotonic() - mark[1], 3)
        if isinstance(msg, StageMsg):
            mark = (msg.stage, time.monotonic())
        elif isinstance(msg, EnvMsg):
            out.env = msg.env
        elif isinstance(msg, TimingMsg):
            setattr(out, "eager" if msg.name == "eager" else "compiled", msg.stats)
        elif isinstance(msg, FlagMsg):
            out.flags.append(msg.flag)
        elif isinstance(msg, ErrorMsg):
            error = msg.error
        elif isinstance(msg, DoneMsg):
            done = True
    outcome = child.outcome()
    out.wall_s = outcome.wall_s
    if not done:
        raise ReferenceFailure(_failure_text(outcome, error), error, outcome.stderr_tail)
    for t in job.trials:
        out.expected[t.index] = torch.load(t.expected_path, weights_only=True)
        os.unlink(t.expected_path)
    return out


def _failure_text(outcome: ChildOutcome, error: ErrorInfo | None) -> str:
    if error is not None:
        return f"reference failed in {outcome.stage}: {error.type}: {error.message}"
    if outcome.killed_for:
        return f"reference worker killed ({outcome.killed_for}) in stage {outcome.stage}"
    how = f"signal {outcome.signal}" if outcome.signal else f"exit code {outcome.returncode}"
    tail = outcome.stderr_tail[-2000:]
    return f"reference worker died ({how}) in stage {outcome.stage}:\n{tail}"
