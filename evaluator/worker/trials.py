"""One correctness trial inside the candidate process, with the probes that watch its call.

Every trial: the inputs the reference worker wrote, cloned; the reference's forward seed; one
call under `no_grad`; the outputs saved for the harness to judge. Around the call: threads
started during it, and whether the output still changes after it returned (deferred work). As
the harness asks per trial: count the candidate's own kernel launches, call again on the same
inputs (determinism), call once first with the kernels replaced by no-ops (ghost kernels), or run
on a second ModelNew built like the reference's second model (the reparam trial).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from types import ModuleType
from typing import Any

import torch
from kloop.evaluator.common.correctness import compare_outputs
from kloop.evaluator.common.protocol import CandidateJob, CandTrial, ProbeMsg, TrialMsg
from kloop.evaluator.worker.construct import (
    as_output_list,
    clone_all,
    init_inputs,
    load_problem,
    noisy_model,
    sync,
    to_device,
)
from kloop.evaluator.worker.probes import (
    custom_launches,
    ghost_compiled_launches,
    ghost_extensions,
    hooked_triton_launches,
    os_threads,
    record_extension_outputs,
    triton_launches,
)
from pydantic import BaseModel


@dataclass
class Loaded:
    """The imported candidate and the model the harness's trials run on."""

    module: ModuleType
    model: torch.nn.Module
    kernel_names: set[str]
    """The candidate's own kernel names (`__global__` functions, `@triton.jit` functions)."""


@dataclass
class _Call:
    outs: list[Any]
    threads_grew: int
    deferred: bool


@dataclass
class _Previous:
    """The CPU copies of the outputs of the last real call in this process (see _ghost_verdict)."""

    outs: list[Any] | None = None


_PREVIOUS = _Previous()


@dataclass
class _Ghost:
    outs: list[Any] | None
    detail: str
    recheck: Callable[[], int | None] | None = None
    """Launches of the candidate's kernels that went past the stubs, counted under the profiler:
    run only when the stubbed call ran without it and its output did not change, i.e. before
    a conviction, never before a pass."""


def _hook_counts(loaded: Loaded, job: CandidateJob) -> bool:
    """Triton kernels only (no CUDA source): their launches can be counted without the
    profiler, whose first session in a process costs seconds of exclusive GPU time."""
    return job.backend == "triton" and bool(loaded.kernel_names)


def _gpu_launches(loaded: Loaded, job: CandidateJob, call: Callable[[], _Call],
                  again: Callable[[], _Call]) -> tuple[_Call, int | None]:
    """(the call, launches of the candidate's own kernels on the GPU during it).

    Triton-only candidates: two counts without the profiler must both see launches of the
    candidate's own kernels: Triton's JIT entry (`triton_launches`: a call of a kernel so named
    returned, so it launched for real) and Triton's launch hook. The hook alone is cheap to
    fool (a candidate can call it with any name); with the JIT entry a candidate must launch one
    of its own kernels for real, which is what the profiler would have seen (on degenerate
    problems there is no ghost trial to back the count up), and the ghost trial still decides
    whether its kernels matter. Anything else (either count zero: a kept
    `CompiledKernel`, a CUDA graph replay, a native launch) is counted again on `again` under
    the profiler, so no verdict rests on the cheap counts alone."""
    names = loaded.kernel_names
    if _hook_counts(loaded, job):
        with triton_launches(names=names) as entered, hooked_triton_launches(names) as seen:
            result = call()
        if entered.count and seen.count:
            return result, seen.count
        return result, custom_launches(again, names)[1]
    return custom_launches(call, names)


PRELOADED_BYTES = 4 << 30
"""At most this much of the trials' input files is read before the device lock."""


def preload_inputs(trials: list[CandTrial]) -> dict[int, list[Any]]:
    """The trials' inputs read from disk before the process asks for the device (trusted code,
    nothing of the candidate's has run): at full sizes they are GiBs (L3/13: 1 GiB per trial).
    In trial order, while their files fit in `PRELOADED_BYTES`; the rest are read under the
    lock, in `run_trial`. A missing or unreadable file is left to `run_trial` too, which
    reports it where it always did."""
    out: dict[int, list[Any]] = {}
    used = 0
    for t in trials:
        try:
            size = os.path.getsize(t.inputs_path)
            if used + size > PRELOADED_BYTES:
                break
            out[t.index] = torch.load(t.inputs_path, weights_only=True)
        except Exception:
            break
        used += size
    return out


def run_trial(loaded: Loaded, trial: CandTrial, job: CandidateJob,
              inputs: list[Any] | None = None,
              second: torch.nn.Module | None = None) -> list[BaseModel]:
    """Run one trial (`inputs`: preloaded by `preload_inputs`; `second`: the reparam trial's
    model, already built on the device); returns the messages for the harness, the TrialMsg
    first. Raises whatever the candidate raised."""
    device = job.problem.device
    if inputs is None:
        inputs = torch.load(trial.inputs_path, weights_only=True)
    inputs = to_device(inputs, device)
    model = loaded.model if trial.perturb_seed is None else \
        second if second is not None else _perturbed(loaded, job, trial)
    ghost = _ghost_call(loaded, model, inputs, trial, job) if trial.ghost else None
    args = clone_all(inputs)
    launches: int | None = None
    if trial.count_launches and device == "cuda":
        with record_extension_outputs():
            call, launches = _gpu_launches(
                loaded, job, lambda: _call(model, args, trial, device),
                lambda: _call(model, clone_all(inputs), trial, device))
    elif trial.count_launches:
        with triton_launches() as seen:
            call = _call(model, args, trial, device)
        launches = seen.count
    else:
        call = _call(model, args, trial, device)
    saved = [_saved(o) for o in call.outs]
    torch.save(saved, trial.output_path)
    previous = _PREVIOUS.outs
    _PREVIOUS.outs = saved
    msgs: list[BaseModel] = [TrialMsg(
        index=trial.index, output_types=[_type_name(o) for o in call.outs],
        mutated_inputs=mutated_inputs(inputs, args), threads_grew=call.threads_grew,
        deferred=call.deferred,
    )]
    if trial.count_launches:
        msgs.append(ProbeMsg(probe="launches", value=None if launches is None else float(launches),
                             conclusive=launches is not None,
                             detail="" if launches is not None else "no kernel names to count"))
    if ghost is not None:
        verdict = _ghost_verdict(ghost, saved, previous, job.tolerance)
        if verdict.value == 1.0 and ghost.recheck is not None:
            verdict = _rechecked(verdict, ghost.recheck())
        msgs.append(verdict)
    if trial.repeat_output_path is not None:
        again = _call(model, clone_all(inputs), trial, device)
        torch.save([_saved(o) for o in again.outs], trial.repeat_output_path)
    return msgs


def _call(model: torch.nn.Module, args: list[Any], trial: CandTrial, device: str) -> _Call:
    # Same generator state as the reference's forward (problems that draw inside forward).
    torch.manual_seed(trial.forward_seed)
    before = os_threads()
    with torch.no_grad():
        out = model(*args)
    grew = os_threads() - before
    outs = as_output_list(out)
    snapshot = [o.detach().clone() if type(o) is torch.Tensor else None for o in outs]
    sync(device)
    return _Call(outs, grew, not _same(snapshot, outs))


def mutated_inputs(before: list[Any], after: list[Any]) -> list[int]:
    """Indices of the input tensors whose contents or shape changed during the call."""
    changed = []
    for i, (a, b) in enumerate(zip(before, after, strict=True)):
        if not isinstance(a, torch.Tensor):
            continue
        if not isinstance(b, torch.Tensor) or a.shape != b.shape or a.dtype != b.dtype:
            changed.append(i)
        elif a.is_floating_point():
            if not bool(((a == b) | (a.isnan() & b.isnan())).all()):
                changed.append(i)
        elif not torch.equal(a, b):
            changed.append(i)
    return changed


def _same(before: list[Any], after: list[Any]) -> bool:
    """Bitwise equal, NaN equal to NaN."""
    for a, b in zip(before, after, strict=True):
        if a is None:
            continue
        if a.shape != b.shape:
            return False
        eq = a == b
        if a.is_floating_point() or a.is_complex():
            eq |= a.isnan() & b.isnan()
        if not bool(eq.all()):
            return False
    return True


def _saved(o: Any) -> Any:
    # A copy even on CPU (where `.cpu()` returns the tensor itself): an output buffer the model
    # reuses would otherwise change under what was kept of an earlier call.
    return o.detach().to("cpu", copy=True) if type(o) is torch.Tensor else None


def _type_name(obj: Any) -> str:
    t = type(obj)
    return "torch.Tensor" if t is torch.Tensor else f"{t.__module__}.{t.__qualname__}"


def _perturbed(loaded: Loaded, job: CandidateJob, trial: CandTrial) -> torch.nn.Module:
    """The reparam trial's ModelNew, built as the reference's was (`construct.noisy_model`)."""
    spec = job.problem
    assert trial.perturb_seed is not None
    return noisy_model(loaded.module.ModelNew, init_inputs(load_problem(spec), spec), spec,
                       trial.perturb_seed, fills_in=trial.fills_path)


def _ghost_call(loaded: Loaded, model: torch.nn.Module, inputs: list[Any], trial: CandTrial,
                job: CandidateJob) -> _Ghost:
    """One call with every kernel of the candidate's replaced by a no-op, made before the real
    call on these inputs: memory left over from earlier calls holds other inputs' values."""
    device = job.problem.device
    names = loaded.kernel_names

    def call() -> Any:
        args = clone_all(inputs)
        torch.manual_seed(trial.forward_seed)
        with torch.no_grad():
            out = model(*args)
        sync(device)
        return out

    def profiled() -> int | None:
        with triton_launches(noop=True), ghost_compiled_launches(names), \
                ghost_extensions():
            return custom_launches(call, names)[1]

    # Triton-only candidates on a GPU: the stubbed call runs without the profiler; only an
    # output that did not change (a conviction to come) is checked for launches that went past
    # the stubs, under the profiler (`recheck`).
    cheap = device == "cuda" and _hook_counts(loaded, job)
    try:
        with triton_launches(noop=True) as tri, ghost_compiled_launches(names) as kept, \
                ghost_extensions() as ext:
            if device == "cuda" and not cheap:
                out, real = custom_launches(call, names)
            else:
                out, real = call(), 0
    except Exception as e:  # the stubs broke the forward: nothing to conclude
        return _Ghost(None, f"the forward raised {type(e).__name__} with its kernels stubbed")
    if tri.count + kept.count + ext.count == 0:
        return _Ghost(None, "no kernel call went through a stub")
    if real is None:
        return _Ghost(None, "no kernel names to check the stubs against")
    if real > 0:
        return _Ghost(None, f"{real} launches of the candidate's kernels bypassed the stubs")
    outs = [_saved(o) for o in as_output_list(out)]
    return _Ghost(outs, f"{tri.count + kept.count + ext.count} kernel calls stubbed",
                  recheck=profiled if cheap else None)


def _rechecked(verdict: ProbeMsg, bypassed: int | None) -> ProbeMsg:
    """A ghost verdict reached without the profiler, kept when the profiler saw no launch of
    the candidate's kernels get past the stubs, else inconclusive."""
    if not bypassed:
        return verdict
    return ProbeMsg(probe="ghost", conclusive=False,
                    detail=f"{bypassed} launches of the candidate's kernels bypassed the stubs")


def _ghost_verdict(ghost: _Ghost, real: list[Any], previous: list[Any] | None,
                   tol: float) -> ProbeMsg:
    """value 1: the output did not change when the kernels did nothing (they are decorative).
    `previous`: the outputs of the call before, on other inputs. When they agree with this
    call's (a degenerate problem), memory that call left behind would look like a ghost output
    that did not change, so nothing can be concluded."""
    if ghost.outs is None or any(o is None for o in real):
        return ProbeMsg(probe="ghost", conclusive=False, detail=ghost.detail or "non-tensor output")
    types = ["torch.Tensor" if o is not None else "None" for o in ghost.outs]

    def same_as_real(outs: list[Any]) -> bool:
        return all(d.ok for d in compare_outputs(real, outs, types, tol))

    unchanged = same_as_real(ghost.outs)
    if unchanged and previous is not None and same_as_real(previous):
        return ProbeMsg(probe="ghost", conclusive=False,
                        detail=f"{ghost.detail}; the output did not change, but the previous call "
                               "on other inputs gave the same output (the problem is degenerate "
                               "here), so stale memory could explain it")
    return ProbeMsg(probe="ghost", value=1.0 if unchanged else 0.0,
                    detail=f"{ghost.detail}; the output {'did not change' if unchanged else 'changed'}")

