"""The stages of one evaluation, run in order by `evaluator.pipeline.evaluate`.

Each stage reads and extends the `EvalRun` and may end it by setting a status:
static (parse, backend, static rules) -> compile (build or check kernels in a child) ->
reference (reference worker: inputs, expected outputs, baselines) -> candidate (candidate
child: load, correctness, timing, profile; judged here, in the harness).
"""

from __future__ import annotations

import ast
import logging
import re
import sys
from pathlib import Path
from typing import Any

import torch

from evaluator.checks import STATIC_CHECKS, trial_violations
from evaluator.correctness import compare_outputs
from evaluator.protocol import (
    AwaitMsg,
    CandidateJob,
    CandTrial,
    CompileJob,
    CompileMsg,
    Control,
    DoneMsg,
    ErrorMsg,
    FlagMsg,
    ProfileMsg,
    ReferenceJob,
    RefTrial,
    StageMsg,
    TimingMsg,
    TrialMsg,
)
from evaluator.reference import collect_reference
from evaluator.result import CorrectnessTrial, ErrorInfo, OutputDiff
from evaluator.sandbox import child_env
from evaluator.state import EvalRun, cuda_arch_list, derive_seed, device_lock

log = logging.getLogger(__name__)

_STAGE_OF_CHILD = {
    "startup": "load", "load": "load", "compile": "compile", "correctness": "correctness",
    "timing": "timing", "profile": "profile",
}
_MAX_OUTPUT_SLACK = 1 << 20


def static_stage(run: EvalRun) -> None:
    """Parse (never execute) the source, detect its backend, run the static rules."""
    with run.timed("static"):
        _static(run)


def _static(run: EvalRun) -> None:
    from evaluator.backend import detect_backend

    try:
        ast.parse(run.source, filename="candidate.py")
    except SyntaxError as e:
        _syntax_error(run, e)
        return
    run.backend = detect_backend(run.source)
    run.has_custom_kernel = run.backend != "torch"
    for check in STATIC_CHECKS:
        run.violations += check(run.source, run.backend, run.policy.name)
    if any(v.severity == "reject" for v in run.violations):
        run.stop("rejected", "static")
    (run.root / "cand" / "candidate.py").write_text(run.source)
    (run.root / "compile" / "candidate.py").write_text(run.source)


def _syntax_error(run: EvalRun, exc: SyntaxError) -> None:
    from evaluator.diagnostics import diagnostic_from_exception, make_compile_log

    # The backend cannot be parsed out of a file that does not parse; a guess is enough here.
    guess = "cuda" if "load_inline" in run.source else "triton" if "triton" in run.source else "torch"
    where = f'  File "candidate.py", line {exc.lineno}\n    {(exc.text or "").rstrip()}'
    run.compile = make_compile_log(guess, False, f"{where}\nSyntaxError: {exc.msg}",
                                   [diagnostic_from_exception(exc, "candidate.py")], None)
    run.stop("compile_error", "static", ErrorInfo(
        type=type(exc).__name__, message=f"{exc.msg} (line {exc.lineno})", traceback=where))


def compile_stage(run: EvalRun) -> None:
    """CUDA candidates: build their extensions into the cache (GPU machine) or compile-check
    them with nvcc (no GPU), in a child that cannot touch the GPU. Triton kernels compile at
    their first launch (GPU) or are compiled for sm_90 after the interpreter ran them (CPU)."""
    run.stage = "compile"
    if run.backend != "cuda":
        return
    with run.timed("compile"):
        _compile(run)


def _compile(run: EvalRun) -> None:
    workdir = run.root / "compile"
    job = CompileJob(candidate_path=str(workdir / "candidate.py"), backend=run.backend,
                     device=run.child_device, build_dir=str(build_dir(run)))
    # Compilation never needs the GPU: hide it so parallel builds do not disturb timings.
    with run.spawn("compile", job, workdir, ["compile"], _build_env(run), device="cpu") as child:
        error, done = None, False
        for msg in child.messages():
            if isinstance(msg, CompileMsg):
                run.compile = msg.log
            elif isinstance(msg, ErrorMsg):
                error = msg
            elif isinstance(msg, DoneMsg):
                done = True
        outcome = child.outcome()
    log_ = run.compile
    if error is not None and error.status == "compile_error":
        run.stop("compile_error", "compile", error.error)
    elif log_ is not None and log_.infra_error:
        run.flags.append("compile_check_incomplete")
    elif log_ is not None and not log_.ok:
        run.stop("compile_error", "compile", ErrorInfo(
            type="CompileError", message=_first_diagnostic(run)))
    elif error is None and not done:
        run.fail_from_outcome(outcome, "compile")
    # A runtime error while importing only to compile is judged where the candidate really runs.
    if run.status is None and run.on_cpu:
        run.stop("not_run", "compile")
        run.flags.append("not_run:no_gpu")


def _first_diagnostic(run: EvalRun) -> str:
    log_ = run.compile
    if log_ is None or not log_.diagnostics:
        return "compilation failed"
    d = log_.diagnostics[0]
    return f"{d.file or '?'}:{d.line or '?'}: {d.message}"


def build_dir(run: EvalRun) -> Path:
    return run.config.cache_dir / "extensions"


def _build_env(run: EvalRun) -> dict[str, str]:
    env = {"KLOOP_CACHE_DIR": str(run.config.cache_dir),
           "KLOOP_NVCC_CHECK_CACHE": str(run.config.cache_dir / "nvcc_check"),
           "TRITON_CACHE_DIR": str(run.root / "triton")}
    if run.on_cpu:
        return env
    arch = cuda_arch_list(run.device)
    if arch:
        env["TORCH_CUDA_ARCH_LIST"] = arch
    return env


def reference_stage(run: EvalRun, job: ReferenceJob | None = None) -> None:
    """Reference worker: correctness inputs (to the candidate's dir), expected outputs (kept in
    the harness's memory only), baselines (cached)."""
    run.stage = "correctness"
    job = job or reference_job(run)
    with device_lock(run.device), run.timed("reference"):
        env = {"TORCHINDUCTOR_CACHE_DIR": str(run.config.cache_dir / "inductor")}
        with run.spawn("reference", job, run.root / "ref", ["reference", "baselines"],
                       env) as child:
            out = collect_reference(child, job)
    run.reference = out
    run.stage_seconds.update(out.stage_seconds)
    run.env, run.eager, run.compiled = out.env, out.eager, out.compiled
    run.flags += out.flags


def reference_job(run: EvalRun) -> ReferenceJob:
    n = run.policy.correct_trials + (1 if run.policy.post_timing_check else 0)
    trials = [
        RefTrial(
            index=k, kind="random" if k < run.policy.correct_trials else "post_timing",
            input_seed=derive_seed(run.salt, "input", k),
            forward_seed=derive_seed(run.salt, "forward", k),
            inputs_path=str(run.root / "cand" / f"inputs_{k}.pt"),
            expected_path=str(run.root / "ref" / f"expected_{k}.pt"),
        )
        for k in range(n)
    ]
    return ReferenceJob(
        problem=run.problem_spec(), trials=trials, baselines=baseline_kinds(run),
        timing=run.timing_spec("baseline"),
        baseline_cache=str(run.config.cache_dir / "baselines"),
        baseline_key_extra={"policy": run.policy.name},
    )


def baseline_kinds(run: EvalRun) -> list[str]:
    mode = run.config.baselines
    if mode == "auto":
        mode = "eager" if run.on_cpu else "both"
    return {"none": [], "eager": ["eager"], "compile": ["compile"],
            "both": ["eager", "compile"]}[mode]


def candidate_stage(run: EvalRun) -> None:
    """Run the candidate child and judge what it produces, trial by trial."""
    run.stage = "load"
    job = _candidate_job(run)
    done = False
    with device_lock(run.device), run.timed("candidate"):
        with run.spawn("candidate", job, run.root / "cand",
                       ["load", "correctness", "timing", "profile", "compile"],
                       _candidate_env(run)) as child:
            for msg in child.messages():
                done = _on_message(run, job, child, msg) or done
            outcome = child.outcome()
    run.mark(None)
    if run.status is None and not done:
        run.fail_from_outcome(outcome, _STAGE_OF_CHILD.get(outcome.stage, "load"))
    if run.status is None:
        _final_verdict(run, job)
    if run.status == "correct" and run.config.ncu and not run.on_cpu:
        with device_lock(run.device), run.timed("ncu"):
            _ncu_pass(run, job)


def _ncu_pass(run: EvalRun, job: CandidateJob) -> None:
    """Nsight Compute metrics for the top custom kernel of the profile (optional feedback)."""
    from evaluator.ncu import ncu_metrics
    from evaluator.resources import bare_name

    top = next((k for k in (run.profile.kernels if run.profile else []) if k.kind == "custom"),
               None)
    if top is None or run.profile is None:
        return
    workdir = run.root / "cand"
    job_path = workdir / "job_forward.json"
    job_path.write_text(job.model_dump_json())
    cmd = [sys.executable, "-m", "evaluator.child", "forward", str(job_path), "-1"]
    env = child_env(workdir / "home", run.device, _candidate_env(run))
    metrics = ncu_metrics(cmd, re.escape(bare_name(top.name)), env, run.config.timeouts.profile)
    if metrics is None:
        run.flags.append("ncu_unavailable")
        return
    run.profile = run.profile.model_copy(update={"ncu": metrics})


def _candidate_env(run: EvalRun) -> dict[str, str]:
    env = _build_env(run)
    if run.on_cpu:
        env["TRITON_INTERPRET"] = "1"
    return env


def _candidate_job(run: EvalRun) -> CandidateJob:
    ref = reference_job(run)
    trials = [
        CandTrial(index=t.index, kind=t.kind, forward_seed=t.forward_seed,
                  inputs_path=t.inputs_path,
                  output_path=str(run.root / "cand" / f"output_{t.index}.pt"))
        for t in ref.trials
    ]
    n = run.policy.correct_trials
    mem = int(run.config.cpu_memory_limit_gb * (1 << 30)) if run.on_cpu else None
    return CandidateJob(
        problem=run.problem_spec(), candidate_path=str(run.root / "cand" / "candidate.py"),
        backend=run.backend or "torch", trials=trials[:n],
        post_timing=trials[n] if len(trials) > n else None,
        timing=run.timing_spec(run.salt), profile=run.config.profile, ncu=run.config.ncu,
        memory_limit_bytes=mem, cpu_emulation=run.on_cpu and run.backend == "triton",
        triton_aot=run.config.triton_aot, build_dir=str(build_dir(run)),
    )


def _on_message(run: EvalRun, job: CandidateJob, child, msg: Any) -> bool:
    if isinstance(msg, StageMsg):
        run.stage = _STAGE_OF_CHILD.get(msg.stage, run.stage)
        run.mark(msg.stage)
    elif isinstance(msg, FlagMsg):
        run.flags.append(msg.flag)
    elif isinstance(msg, ErrorMsg):
        run.stop(msg.status, _STAGE_OF_CHILD.get(msg.stage, run.stage), msg.error)
    elif isinstance(msg, TrialMsg):
        _judge_trial(run, job, msg)
    elif isinstance(msg, AwaitMsg):
        go = _all_passed(run, job) and not _rejected(run) and not _compile_failed(run)
        child.send(Control(next="time" if go else "stop"))
    elif isinstance(msg, TimingMsg) and msg.name == "candidate":
        run.timing = msg.stats
    elif isinstance(msg, ProfileMsg):
        run.profile = msg.summary
    elif isinstance(msg, CompileMsg):
        run.compile = msg.log
    elif isinstance(msg, DoneMsg):
        return True
    return False


def _trial_spec(job: CandidateJob, index: int) -> CandTrial | None:
    for t in [*job.trials, job.post_timing]:
        if t is not None and t.index == index:
            return t
    return None


def _judge_trial(run: EvalRun, job: CandidateJob, msg: TrialMsg) -> None:
    spec = _trial_spec(job, msg.index)
    if spec is None or any(t.trial == msg.index for t in run.trials):
        run.flags.append("unexpected_trial_message")
        return
    assert run.reference is not None
    expected = run.reference.expected[msg.index]
    got, problem = _load_output(Path(spec.output_path), expected)
    if problem is not None:
        diffs = [OutputDiff(ok=False, expected_shape=list(expected[0].shape),
                            expected_dtype=str(expected[0].dtype), message=problem)]
    else:
        diffs = compare_outputs(expected, got, msg.output_types, run.policy.tolerance(
            run.config.precision))
    if any(d.got_type for d in diffs):
        run.flags.append("non_tensor_output")
    passed = all(d.ok for d in diffs)
    run.trials.append(CorrectnessTrial(
        trial=msg.index, kind=spec.kind, passed=passed, outputs=diffs,
        message=None if passed else next((d.message for d in diffs if not d.ok), None)))
    run.violations += trial_violations(run, msg)


def _load_output(path: Path, expected: list[Any]) -> tuple[list[Any], str | None]:
    """Load what the candidate wrote, never unpickling code and never reading a huge file."""
    if not path.exists():
        return [], "the candidate wrote no output for this trial"
    limit = 4 * sum(e.numel() * e.element_size() for e in expected) + _MAX_OUTPUT_SLACK
    if path.stat().st_size > limit:
        return [], f"output file of {path.stat().st_size} bytes is far larger than expected"
    try:
        got = torch.load(path, weights_only=True)
    except Exception as e:
        return [], f"unreadable output file: {type(e).__name__}: {e}"
    finally:
        path.unlink(missing_ok=True)
    if not isinstance(got, list):
        return [], "malformed output file"
    return got, None


def _all_passed(run: EvalRun, job: CandidateJob) -> bool:
    judged = {t.trial: t.passed for t in run.trials}
    return all(judged.get(t.index, False) for t in job.trials)


def _compile_failed(run: EvalRun) -> bool:
    return run.compile is not None and not run.compile.ok and not run.compile.infra_error


def _rejected(run: EvalRun) -> bool:
    return any(v.severity == "reject" for v in run.violations)


def _final_verdict(run: EvalRun, job: CandidateJob) -> None:
    expected = [t.index for t in job.trials]
    if job.post_timing is not None and run.timing is not None:
        expected.append(job.post_timing.index)
    judged = {t.trial: t for t in run.trials}
    missing = [k for k in expected if k not in judged]
    if _compile_failed(run):
        run.stop("compile_error", "compile", ErrorInfo(
            type="CompileError", message=_first_diagnostic(run)))
    elif _rejected(run):
        run.stop("rejected", run.stage)
    elif missing or not all(judged[k].passed for k in expected):
        if missing:
            run.error = ErrorInfo(type="MissingTrials", message=f"trials {missing} never ran")
        run.stop("incorrect", run.stage)
    else:
        run.stop("correct", "done")
