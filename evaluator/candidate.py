"""The code that runs inside the candidate process (started by `evaluator.child`).

Load (import `candidate.py`, build `ModelNew` the KernelBench way) -> correctness trials on the
inputs the reference worker wrote (outputs saved for the harness to judge) -> wait for the
harness -> timing -> post-timing trial -> profile. Any exception is reported as a typed error
and ends the process; the harness turns silence (a crash) into an error itself.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

import torch

from evaluator.child import (
    Channel,
    apply_overrides,
    error_info,
    import_candidate,
    read_control,
)
from evaluator.construct import (
    apply_numerics,
    as_output_list,
    clone_all,
    construct,
    draw_inputs,
    init_inputs,
    load_problem,
    sync,
    to_device,
)
from evaluator.protocol import (
    AwaitMsg,
    CandidateJob,
    CandTrial,
    CompileJob,
    CompileMsg,
    DoneMsg,
    ErrorMsg,
    FlagMsg,
    ProfileMsg,
    TimingMsg,
    TrialMsg,
)
from evaluator.result import CompileLog, ErrorInfo
from evaluator.timing import time_callable

log = logging.getLogger(__name__)


def run_candidate(job: CandidateJob, ch: Channel) -> None:
    spec, path = job.problem, job.candidate_path
    apply_numerics(spec.allow_tf32)
    if job.cpu_emulation:
        from evaluator import emulation

        emulation.install()
        ch.send(FlagMsg(flag="cpu_emulation"))
    ch.stage("load")
    model = _load(job, ch)
    if model is None:
        return
    ch.stage("correctness")
    for trial in job.trials:
        if not _run_trial(model, trial, job, ch):
            return
    if job.cpu_emulation and job.triton_aot:
        triton_aot(job, ch)
    ch.send(AwaitMsg())
    if read_control().next == "stop":
        ch.send(DoneMsg())
        return
    if job.timing is not None:
        ch.stage("timing")
        try:
            problem = load_problem(spec)
            sets = [draw_inputs(problem, seed, spec) for seed in job.timing.input_seeds]
            stats = time_callable(
                model, sets, device=spec.device, trials=job.timing.trials,
                warmup_calls=job.timing.warmup_calls, warmup_ms=job.timing.warmup_ms,
                l2_flush=job.timing.l2_flush,
            )
        except BaseException as e:
            ch.error("timing", e, path, "runtime_error")
            return
        ch.send(TimingMsg(name="candidate", stats=stats))
    if job.post_timing is not None:
        ch.stage("correctness")
        if not _run_trial(model, job.post_timing, job, ch):
            return
    if job.profile:
        _profile(model, job, ch)
    ch.send(DoneMsg())


def run_forward(job: CandidateJob, ch: Channel, calls: int = 2) -> None:
    """Build the candidate and call it a few times on timing inputs (replayed under ncu)."""
    apply_numerics(job.problem.allow_tf32)
    model = _load(job, ch)
    if model is None:
        return
    inputs = draw_inputs(load_problem(job.problem), job.timing.input_seeds[0] if job.timing
                         else 0, job.problem)
    with torch.no_grad():
        for _ in range(calls):
            model(*inputs)
    sync(job.problem.device)
    ch.send(DoneMsg())


def _load(job: CandidateJob, ch: Channel) -> torch.nn.Module | None:
    spec, path = job.problem, job.candidate_path
    _install_build_cache(job.build_dir, path, check_only=False)
    if job.cpu_emulation:
        from evaluator.triton_aot import install_triton_launch_recorder

        # Records launches for the sm_90 check and names them in the CPU profile.
        install_triton_launch_recorder()
    problem = load_problem(spec)
    try:
        module = import_candidate(path)
    except BaseException as e:
        _fail(ch, "load", e, job, import_time=True)
        return None
    if (log_ := builds_log()) is not None:
        ch.send(CompileMsg(log=log_))
    if not isinstance(getattr(module, "ModelNew", None), type):
        info = ErrorInfo(type="MissingModelNew", message="the candidate defines no class ModelNew")
        ch.send(ErrorMsg(stage="load", status="compile_error", error=info))
        return None
    try:
        apply_overrides(module, spec.overrides)
        return construct(module.ModelNew, init_inputs(problem, spec), spec)
    except BaseException as e:
        _fail(ch, "load", e, job)
        return None


def _fail(ch: Channel, stage: str, exc: BaseException, job: CandidateJob,
          import_time: bool = False) -> None:
    """Build errors (at import: also a failed import; later: Triton or extension builds that
    happen lazily) are compile errors, everything else a runtime error."""
    from evaluator.child import is_build_error

    if is_build_error(exc) and (import_time or not isinstance(exc, ImportError)):
        report_build_error(ch, stage, exc, job.candidate_path, job.backend)
        return
    # Under the interpreter a kernel the GPU compiler would reject may fail at run time
    # instead; compiling what was launched tells the two apart.
    if job.cpu_emulation and job.triton_aot:
        log_ = triton_aot(job, ch)
        if log_ is not None and not log_.ok and not log_.infra_error:
            ch.send(ErrorMsg(stage="compile", status="compile_error", error=ErrorInfo(
                type="TritonCompileError", message=_first_message(log_),
                traceback=error_info(exc, job.candidate_path).traceback)))
            return
    ch.error(stage, exc, job.candidate_path, "runtime_error")


def _first_message(log_: CompileLog) -> str:
    d = log_.diagnostics[0] if log_.diagnostics else None
    return d.message if d else "Triton compilation failed"


def _run_trial(model: torch.nn.Module, trial: CandTrial, job: CandidateJob, ch: Channel) -> bool:
    device = job.problem.device
    try:
        inputs = to_device(torch.load(trial.inputs_path, weights_only=True), device)
        args = clone_all(inputs)
        # Same generator state as the reference's forward (problems that draw inside forward).
        torch.manual_seed(trial.forward_seed)
        with torch.no_grad():
            out = model(*args)
        sync(device)
        outs = as_output_list(out)
        saved = [o.detach().cpu() if type(o) is torch.Tensor else None for o in outs]
        torch.save(saved, trial.output_path)
    except BaseException as e:
        _fail(ch, "correctness", e, job)
        return False
    ch.send(TrialMsg(
        index=trial.index,
        output_types=[_type_name(o) for o in outs],
        mutated_inputs=mutated_inputs(inputs, args),
    ))
    return True


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


def _type_name(obj: Any) -> str:
    t = type(obj)
    return "torch.Tensor" if t is torch.Tensor else f"{t.__module__}.{t.__qualname__}"


def _profile(model: torch.nn.Module, job: CandidateJob, ch: Channel) -> None:
    ch.stage("profile")
    try:
        from evaluator.backend import custom_kernel_names
        from evaluator.profile import profile_forward

        problem = load_problem(job.problem)
        seed = job.timing.input_seeds[0] if job.timing else 0
        inputs = draw_inputs(problem, seed, job.problem)
        names = custom_kernel_names(Path(job.candidate_path).read_text())
        summary = profile_forward(model, inputs, job.problem.device, names)
    except BaseException as e:
        # Profiling is feedback, not judgement: a failure here never changes the status.
        info = error_info(e, job.candidate_path)
        ch.send(FlagMsg(flag=f"profile_failed: {info.type}: {info.message[:200]}"))
        return
    ch.send(ProfileMsg(summary=summary))


# ---- builds and compile checks ------------------------------------------------------------


def run_compile(job: CompileJob, ch: Channel) -> None:
    """Import the candidate only to build its extensions into the cache (GPU machine, GPU
    hidden) or, without a GPU, to compile-check their sources with nvcc."""
    from evaluator import buildcache

    ch.stage("compile")
    _install_build_cache(job.build_dir, job.candidate_path, check_only=job.device == "cpu")
    error: BaseException | None = None
    try:
        import_candidate(job.candidate_path)
    except buildcache.CudaNotAvailable:
        pass
    except BaseException as e:
        error = e
    log_ = builds_log()
    if log_ is not None:
        ch.send(CompileMsg(log=log_))
    if error is not None and (log_ is None or log_.ok):
        _import_error(ch, error, job.candidate_path, job.backend)
    ch.send(DoneMsg())


def _install_build_cache(build_dir: str | None, candidate_path: str, check_only: bool) -> None:
    """Route `load_inline` through kloop's content-addressed build cache (or, without a GPU,
    through an nvcc compile check that raises `CudaNotAvailable`)."""
    from evaluator import buildcache

    if build_dir is None:
        return
    source = Path(candidate_path).read_text()
    if check_only:
        buildcache.install_compile_check_only(
            Path(build_dir), Path(candidate_path).parent / "nvcc", candidate_source=source,
            candidate_name="candidate.py")
    else:
        # The compile child sees no GPU: the arch comes from TORCH_CUDA_ARCH_LIST (harness).
        buildcache.install_load_inline_cache(
            Path(build_dir), arch=os.environ.get("TORCH_CUDA_ARCH_LIST") or None,
            candidate_source=source, candidate_name="candidate.py")


def builds_log() -> CompileLog | None:
    """One CompileLog for every `load_inline` call the candidate made (None if it made none)."""
    from evaluator.buildcache import BUILD_RECORDS

    if not BUILD_RECORDS:
        return None
    logs = [r.compile or CompileLog(backend="cuda", ok=r.ok, cache_hit=r.cache_hit,
                                    seconds=r.seconds) for r in BUILD_RECORDS]
    if len(logs) == 1:
        return logs[0]
    return logs[0].model_copy(update={
        "ok": all(x.ok for x in logs),
        "diagnostics": [d for x in logs for d in x.diagnostics],
        "log_tail": "\n".join(x.log_tail for x in logs if x.log_tail)[-16384:],
        "infra_error": next((x.infra_error for x in logs if x.infra_error), None),
        "cache_hit": all(x.cache_hit for x in logs),
        "resources": [r for x in logs for r in x.resources],
        "seconds": sum(x.seconds or 0.0 for x in logs),
    })


def report_build_error(ch: Channel, stage: str, exc: BaseException, path: str,
                       backend: str) -> None:
    """A build error as a compile log with a location in candidate.py, and as the error."""
    from evaluator.diagnostics import diagnostic_from_exception, make_compile_log

    info = error_info(exc, path)
    log_ = builds_log()
    if log_ is None or log_.ok:
        log_ = make_compile_log(backend, False, info.traceback or info.message,
                                [diagnostic_from_exception(exc, path)], None)
    ch.send(CompileMsg(log=log_))
    ch.send(ErrorMsg(stage=stage, status="compile_error", error=info))


def _import_error(ch: Channel, exc: BaseException, path: str, backend: str) -> None:
    from evaluator.child import is_build_error

    if is_build_error(exc):
        report_build_error(ch, "compile", exc, path, backend)
    else:
        ch.error("compile", exc, path, "runtime_error")


def triton_aot(job: CandidateJob, ch: Channel) -> CompileLog | None:
    """Compile the Triton kernels the candidate launched (under the interpreter) for sm_90."""
    from evaluator.triton_aot import recorded_launches, triton_aot_check

    if not recorded_launches():
        return None
    ch.stage("compile")
    log_ = triton_aot_check(candidate_path=job.candidate_path,
                            work_dir=Path(job.candidate_path).parent / "triton_aot")
    ch.send(CompileMsg(log=log_))
    return log_
