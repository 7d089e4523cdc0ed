"""The code that runs inside the candidate process (started by `evaluator.worker.child`).

Everything here runs in the process that also runs the candidate's code, so it is evidence at
best: whatever it reports can be forged, and the harness relies on none of it for a number.

Load (import `candidate.py`, build `ModelNew` as the reference was built) -> probe trials on the
inputs the reference worker wrote (outputs saved for the harness to judge; `evaluator.worker.trials`
runs them with their probes: launches, ghost kernels, determinism, reparam) -> process-level
probes (`evaluator.worker.probes`) -> wait for the harness -> serve the harness's timed, checked calls
(`evaluator.worker.serve`) -> probes again -> profile. Any exception is reported as a typed
error and ends the process; the harness turns silence (a crash) into an error itself.
Built ahead (`evaluator.worker.ahead`), the load happens before the wait for the harness, on
CPU; after it, the models are only moved to the device.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import torch
from pydantic import BaseModel

from kloop.evaluator.common.protocol import (
    AwaitMsg,
    CallProblemMsg,
    CandidateJob,
    CandTrial,
    CompileJob,
    CompileMsg,
    DoneMsg,
    ErrorMsg,
    FlagMsg,
    ProfileMsg,
    ReadyMsg,
    RetryMsg,
)
from kloop.evaluator.common.result import CompileLog, ErrorInfo
from kloop.evaluator.worker.ahead import Ahead, build_ahead, device_unusable, kept_from_device
from kloop.evaluator.worker.child import (
    Channel,
    apply_overrides,
    call_server,
    error_info,
    import_candidate,
    read_control,
    wait_for_device,
)
from kloop.evaluator.worker.construct import (
    apply_numerics,
    construct,
    draw_inputs,
    draw_served_inputs,
    init_inputs,
    load_problem,
    sync,
)
from kloop.evaluator.worker.probes import Baseline
from kloop.evaluator.worker.trials import Loaded, preload_inputs, run_trial

log = logging.getLogger(__name__)


def run_candidate(job: CandidateJob, ch: Channel,
                  call_fds: tuple[int, int, int] | None = None) -> None:
    # Nothing of the candidate's is imported before this; reading the trials' inputs from disk
    # needs no device, so it is done before the lock too.
    preloaded = preload_inputs(job.trials)
    ahead = None
    if job.construct_ahead and kept_from_device(job.ahead_hidden):
        ahead = build_ahead(job)
        if isinstance(ahead, str):
            ch.send(ReadyMsg(ahead=True, retry=ahead))
            return
    if not wait_for_device(ch, ahead=ahead is not None):
        return
    if ahead is None:
        base, loaded = _load_under_lock(job, ch)
    else:
        if (why := device_unusable(job.problem.device, job.ahead_hidden)) is not None:
            ch.send(RetryMsg(reason=why))
            return
        base, loaded = ahead.base, _place(ahead, job, ch)
    if loaded is None:
        return
    ch.stage("correctness")
    for trial in job.trials:
        model = ahead.models.pop(trial.index, None) if ahead is not None else None
        with _profiled(ch, f"trial {trial.index}", job.profile_trials):
            if not _trial(loaded, trial, job, ch, preloaded.pop(trial.index, None), model):
                return
    _send_all(ch, base.report("after the correctness trials"))
    if job.cpu_emulation and job.triton_aot:
        triton_aot(job, ch)
    ch.send(AwaitMsg())
    control = read_control()
    if control.next != "serve":
        ch.send(DoneMsg())
        return
    if not _serve(loaded, job, ch, base, call_fds, control.data):
        return
    _send_all(ch, base.report("after the timed calls"))
    if job.profile:
        _profile(loaded.model, job, ch)
    ch.send(DoneMsg())


@contextlib.contextmanager
def _profiled(ch: Channel, label: str, on: bool) -> Iterator[None]:
    """`CandidateJob.profile_trials` (diagnostics): the block under cProfile, its top entries
    with its wall and CPU time sent as a flag. The numbers are this process's own: forgeable,
    never a verdict."""
    if not on:
        yield
        return
    import cProfile
    import io
    import pstats
    import time

    prof, wall, cpu = cProfile.Profile(), time.monotonic(), time.process_time()
    prof.enable()
    try:
        yield
    finally:
        prof.disable()
        buf = io.StringIO()
        pstats.Stats(prof, stream=buf).sort_stats("cumulative").print_stats(25)
        ch.send(FlagMsg(flag=f"profile {label}: wall {time.monotonic() - wall:.3f} s, cpu "
                             f"{time.process_time() - cpu:.3f} s\n{buf.getvalue()}"))


def _load_under_lock(job: CandidateJob, ch: Channel) -> tuple[Baseline, Loaded | None]:
    apply_numerics(job.problem.allow_tf32)
    if job.cpu_emulation:
        from kloop.evaluator.worker import emulation

        emulation.install()
        ch.send(FlagMsg(flag="cpu_emulation"))
    # Before any candidate code runs: what its code must not change.
    base = Baseline.take(job.problem.device)
    ch.stage("load")
    return base, _load(job, ch)


def _place(ahead: Ahead, job: CandidateJob, ch: Channel) -> Loaded | None:
    """Under the lock: the device part of the baseline, the messages kept back, then the
    models built ahead moved to the device (the one built under the lock where there is none)."""
    spec = job.problem
    ahead.base.take_device(spec.device)
    for msg in ahead.pending:
        ch.send(msg)
    ch.stage("load")
    loaded = ahead.loaded
    try:
        if loaded.model is None:
            loaded.model = construct(loaded.module.ModelNew, init_inputs(load_problem(spec), spec),
                                     spec, fills_in=job.fills_path)
        else:
            loaded.model = loaded.model.to(device=spec.device)
    except BaseException as e:
        _fail(ch, "load", e, job)
        return None
    return loaded


def _serve(loaded: Loaded, job: CandidateJob, ch: Channel, base: Baseline,
           call_fds: tuple[int, int, int] | None, layout: str | None) -> bool:
    """Serve the harness's timed calls (`evaluator.worker.serve`): the harness holds the clock
    and checks every output; nothing here measures or judges anything."""
    ch.stage("timing")
    spec = job.problem
    raised: list[BaseException] = []

    def on_problem(message: str, exc: BaseException | None) -> None:
        if exc is None:
            ch.send(CallProblemMsg(message=message))
        else:
            raised.append(exc)
            ch.error("timing", exc, job.candidate_path, "runtime_error")

    try:
        problem = load_problem(spec)
        server = call_server(call_fds, layout, spec.device)
        base.restore_l2()
        server.serve(loaded.model, lambda seed: draw_served_inputs(problem, seed, spec),
                     on_problem)
    except BaseException as e:
        if not raised:
            ch.error("timing", e, job.candidate_path, "runtime_error")
        return False
    return not raised


def _send_all(ch: Channel, msgs: list[BaseModel]) -> None:
    for msg in msgs:
        ch.send(msg)


def _trial(loaded: Loaded, trial: CandTrial, job: CandidateJob, ch: Channel,
           inputs: list | None = None, model: torch.nn.Module | None = None) -> bool:
    try:
        if model is not None:
            model = model.to(device=job.problem.device)
        msgs = run_trial(loaded, trial, job, inputs, model)
    except BaseException as e:
        _fail(ch, "correctness", e, job)
        return False
    _send_all(ch, msgs)
    return True


def run_forward(job: CandidateJob, ch: Channel, calls: int = 2) -> None:
    """Build the candidate and call it a few times on timing inputs (replayed under ncu)."""
    apply_numerics(job.problem.allow_tf32)
    ch.stage("load")
    loaded = _load(job, ch)
    if loaded is None:
        return
    ch.stage("correctness")
    inputs = draw_inputs(load_problem(job.problem), 0, job.problem)
    with torch.no_grad():
        for _ in range(calls):
            loaded.model(*inputs)
    sync(job.problem.device)
    ch.send(DoneMsg())


def _before_import(job: CandidateJob) -> None:
    _install_build_cache(job.build_dir, job.candidate_path, check_only=False)
    if job.cpu_emulation:
        from kloop.evaluator.build.triton_aot import install_triton_launch_recorder

        # Records launches for the sm_90 check and names them in the CPU profile.
        install_triton_launch_recorder()


def _import(job: CandidateJob) -> tuple[ModuleType, set[str]]:
    """The candidate imported (after `_before_import`); its own kernel names."""
    from kloop.evaluator.common.backend import custom_kernel_names

    module = import_candidate(job.candidate_path)
    return module, custom_kernel_names(Path(job.candidate_path).read_text())


def _load(job: CandidateJob, ch: Channel) -> Loaded | None:
    spec = job.problem
    _before_import(job)
    problem = load_problem(spec)
    try:
        module, names = _import(job)
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
        model = construct(module.ModelNew, init_inputs(problem, spec), spec,
                          fills_in=job.fills_path)
    except BaseException as e:
        _fail(ch, "load", e, job)
        return None
    return Loaded(module, model, names)


def _fail(ch: Channel, stage: str, exc: BaseException, job: CandidateJob,
          import_time: bool = False) -> None:
    """Build errors (at import: also a failed import; later: Triton or extension builds that
    happen lazily) are compile errors, everything else a runtime error."""
    from kloop.evaluator.worker.child import is_build_error

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


def _profile(model: torch.nn.Module, job: CandidateJob, ch: Channel) -> None:
    ch.stage("profile")
    try:
        from kloop.evaluator.common.backend import custom_kernel_names
        from kloop.evaluator.worker.profile import profile_forward

        problem = load_problem(job.problem)
        inputs = draw_inputs(problem, 0, job.problem)
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
    from kloop.evaluator.build import buildcache

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
    through an nvcc compile check that raises `CudaNotAvailable`). `build_dir` holds the builds
    the harness verified for this file (read-only); new builds go to `build/` beside the
    candidate, for the harness to install (`evaluator.build.buildstore`)."""
    from kloop.evaluator.build import buildcache

    if build_dir is None:
        return
    source = Path(candidate_path).read_text()
    private = Path(candidate_path).parent / "build"
    if check_only:
        buildcache.install_compile_check_only(
            private, Path(candidate_path).parent / "nvcc", verified_root=Path(build_dir),
            candidate_source=source, candidate_name="candidate.py")
    else:
        # The compile child sees no GPU: the arch comes from TORCH_CUDA_ARCH_LIST (harness).
        buildcache.install_load_inline_cache(
            private, arch=os.environ.get("TORCH_CUDA_ARCH_LIST") or None,
            verified_root=Path(build_dir), candidate_source=source, candidate_name="candidate.py")


def builds_log() -> CompileLog | None:
    """One CompileLog for every `load_inline` call the candidate made (None if it made none)."""
    from kloop.evaluator.build.buildcache import BUILD_RECORDS

    if not BUILD_RECORDS:
        return None
    logs = [(r.compile or CompileLog(backend="cuda", ok=r.ok, cache_hit=r.cache_hit,
                                     seconds=r.seconds)).model_copy(
                update={"nvcc_runs": r.nvcc_runs, "cxx_runs": r.cxx_runs})
            for r in BUILD_RECORDS]
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
        "nvcc_runs": [run for x in logs for run in x.nvcc_runs],
        "cxx_runs": [run for x in logs for run in x.cxx_runs],
    })


def report_build_error(ch: Channel, stage: str, exc: BaseException, path: str,
                       backend: str) -> None:
    """A build error as a compile log with a location in candidate.py, and as the error."""
    from kloop.evaluator.build.diagnostics import diagnostic_from_exception, make_compile_log

    info = error_info(exc, path)
    log_ = builds_log()
    if log_ is None or log_.ok:
        log_ = make_compile_log(backend, False, info.traceback or info.message,
                                [diagnostic_from_exception(exc, path)], None)
    ch.send(CompileMsg(log=log_))
    ch.send(ErrorMsg(stage=stage, status="compile_error", error=info))


def _import_error(ch: Channel, exc: BaseException, path: str, backend: str) -> None:
    from kloop.evaluator.worker.child import is_build_error

    if is_build_error(exc):
        report_build_error(ch, "compile", exc, path, backend)
    else:
        ch.error("compile", exc, path, "runtime_error")


def triton_aot(job: CandidateJob, ch: Channel) -> CompileLog | None:
    """Compile the Triton kernels the candidate launched (under the interpreter) for sm_90."""
    from kloop.evaluator.build.triton_aot import recorded_launches, triton_aot_check

    if not recorded_launches():
        return None
    ch.stage("compile")
    log_ = triton_aot_check(candidate_path=job.candidate_path,
                            work_dir=Path(job.candidate_path).parent / "triton_aot")
    ch.send(CompileMsg(log=log_))
    return log_
