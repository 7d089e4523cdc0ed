"""The stages of one evaluation, run in order by `evaluator.harness.pipeline.evaluate`.

Each stage takes the run's resources (`EvalRun`) and the findings of the stages before it, and
returns its own (`evaluator.harness.ledger`); a `Decided` among them ends the run:
static (parse, backend, static rules) -> compile (build or check kernels in a child) ->
reference (reference worker: inputs, expected outputs, baselines) -> candidate (candidate
child: load, correctness, timing, profile; judged here, in the harness).
"""

from __future__ import annotations

import ast
import contextlib
import dataclasses
import logging
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path

from kloop.evaluator.build import buildstore, cxx_pch, lean, pch
from kloop.evaluator.common.protocol import (
    CandidateJob,
    CompileJob,
    CompileMsg,
    DoneMsg,
    ErrorMsg,
    ReferenceJob,
    RetryMsg,
)
from kloop.evaluator.common.result import ErrorInfo, TimingStats
from kloop.evaluator.harness import budget
from kloop.evaluator.harness.checks import STATIC_CHECKS
from kloop.evaluator.harness.judge import (
    STAGE_OF_CHILD,
    MessageOrder,
    candidate_job,
    final_verdict,
    first_diagnostic,
    on_message,
    ref_trials,
    served64,
    served_seeds,
)
from kloop.evaluator.harness.ledger import Ledger
from kloop.evaluator.harness.outcome import (
    Built,
    Clocked,
    Detected,
    Entered,
    Finding,
    Flagged,
    Measured,
    Observed,
    Profiled,
    violated,
)
from kloop.evaluator.harness.precheck import precheck_source
from kloop.evaluator.harness.reference import ReferenceOutput, Serving, collect_reference
from kloop.evaluator.harness.served import null_call_count
from kloop.evaluator.harness.servers import server_key
from kloop.evaluator.harness.state import EvalRun, child_failure, cuda_arch_list
from kloop.evaluator.procs import board
from kloop.evaluator.procs.buildslots import build_slot, default_slots
from kloop.evaluator.procs.devicelock import HoldKind
from kloop.evaluator.procs.isolation import identity_env, private_dir, write_new
from kloop.evaluator.procs.sandbox import Child, ChildOutcome, child_env

log = logging.getLogger(__name__)

_AST_LOCK = threading.Lock()
"""One static stage at a time in this process: CPython 3.11's `ast` constructors keep a
recursion depth that is not safe across threads (`SystemError: AST constructor recursion depth
mismatch`, seen in a batch of CPU evaluations on 2026-12-05); the stage takes milliseconds."""


def static_stage(run: EvalRun, before: Sequence[Finding] = ()) -> list[Finding]:
    """Parse (never execute) the source, detect its backend, run the static rules."""
    ledger = Ledger(run.root, before)
    with ledger.timed("static"), _AST_LOCK:
        _static(run, ledger)
    return ledger.found


def _static(run: EvalRun, ledger: Ledger) -> None:
    from kloop.evaluator.common.backend import detect_backend

    try:
        ast.parse(run.source, filename="candidate.py")
    except SyntaxError as e:
        _syntax_error(run, ledger, e)
        return
    if (bad := precheck_source(run.source)) is not None:  # empty, or no ModelNew: stop before any child
        ledger.stop("compile_error", "static", ErrorInfo(type=bad.kind, message=bad.message))
        return
    backend = detect_backend(run.source)
    ledger.record(Detected(backend=backend, has_custom_kernel=backend != "torch"))
    for check in STATIC_CHECKS:
        ledger.record(*violated(*check(run.source, backend, run.policy.name)))
    if any(v.severity == "reject" for v in ledger.verdict.violations):
        ledger.stop("rejected", "static")
    (run.root / "cand" / "candidate.py").write_text(run.source)
    (run.root / "compile" / "candidate.py").write_text(run.source)


def _syntax_error(run: EvalRun, ledger: Ledger, exc: SyntaxError) -> None:
    from kloop.evaluator.build.diagnostics import diagnostic_from_exception, make_compile_log

    # The backend cannot be parsed out of a file that does not parse; a guess is enough here.
    guess = "cuda" if "load_inline" in run.source else "triton" if "triton" in run.source else "torch"
    where = f'  File "candidate.py", line {exc.lineno}\n    {(exc.text or "").rstrip()}'
    ledger.record(Built(log=make_compile_log(guess, False, f"{where}\nSyntaxError: {exc.msg}",
                                             [diagnostic_from_exception(exc, "candidate.py")],
                                             None)))
    ledger.stop("compile_error", "static", ErrorInfo(
        type=type(exc).__name__, message=f"{exc.msg} (line {exc.lineno})", traceback=where))


def compile_stage(run: EvalRun, before: Sequence[Finding] = ()) -> list[Finding]:
    """CUDA candidates: build their extensions into the cache (GPU machine) or compile-check
    them with nvcc (no GPU), in a child that cannot touch the GPU. Triton kernels compile at
    their first launch (GPU) or are compiled for sm_90 after the interpreter ran them (CPU)."""
    ledger = Ledger(run.root, before)
    ledger.record(Entered(stage="compile"))
    if ledger.verdict.backend != "cuda":
        return ledger.found
    _start_pch(run)
    t0 = time.monotonic()
    slots = run.config.build_slots or default_slots()
    with contextlib.ExitStack() as slot:
        with board.phase("build_wait"):
            slot.enter_context(build_slot(private_dir(run.config.cache_dir) / "locks", slots))
        ledger.clock("build_wait", time.monotonic() - t0)
        with board.phase("build"), ledger.timed("compile"):
            _compile(run, ledger)
    return ledger.found


def _start_pch(run: EvalRun) -> None:
    """Have the missing precompiled headers made in the background (trusted code, fixed text,
    torch's flags): this build runs without them if they are not ready."""
    mode = run.config.pch
    if mode == "on" or (mode == "auto" and not run.on_cpu):
        pch.ensure_async(pch.default_variants(cuda=not run.on_cpu))
    if mode != "off" and run.on_cpu:  # no GPU: CUDA sources are compile-checked instead
        pch.ensure_check_async()


def _compile(run: EvalRun, ledger: Ledger) -> None:
    workdir = run.root / "compile"
    store = buildstore.Store(run.config.cache_dir, run.source_sha256, run.sandbox)
    store.stage(build_dir(run), run.root / "nvcc_checks")
    job = CompileJob(candidate_path=str(workdir / "candidate.py"), backend=ledger.verdict.backend,
                     device=run.child_device, build_dir=str(build_dir(run)))
    # Compilation never needs the GPU: hide it so parallel builds do not disturb timings.
    with run.spawn(ledger, "compile", job, workdir, ["compile"], _build_env(run),
                   device="cpu") as child:
        error, done = None, False
        for msg in child.messages():
            if isinstance(msg, CompileMsg):
                ledger.record(Built(log=msg.log))
            elif isinstance(msg, ErrorMsg):
                error = msg
            elif isinstance(msg, DoneMsg):
                done = True
        outcome = child.outcome()
    # The child is gone: what it built and checked enters the store, then the verified copies
    # its file's candidate child may load.
    store.install(workdir / "build", workdir / "nvcc_cache")
    store.stage(build_dir(run), run.root / "nvcc_checks")
    log_ = ledger.verdict.compile
    if error is not None and error.status == "compile_error":
        ledger.stop("compile_error", "compile", error.error)
    elif log_ is not None and log_.infra_error:
        ledger.record(Flagged(flag="compile_check_incomplete"))
    elif log_ is not None and not log_.ok:
        ledger.stop("compile_error", "compile", ErrorInfo(
            type="CompileError", message=first_diagnostic(ledger.verdict)))
    elif error is None and not done:
        ledger.record(child_failure(outcome, "compile", run.config))
    # A runtime error while importing only to compile is judged where the candidate really runs.
    if ledger.verdict.status is None and run.on_cpu:
        ledger.stop("not_run", "compile")
        ledger.record(Flagged(flag="not_run:no_gpu"))


def build_dir(run: EvalRun) -> Path:
    """The builds of this candidate file, verified and read-only (see `evaluator.build.buildstore`)."""
    return run.root / "ext"


def _build_env(run: EvalRun) -> dict[str, str]:
    env = {"KLOOP_CACHE_DIR": str(run.writable_cache),
           "KLOOP_NVCC_CHECK_CACHE": str(run.root / "compile" / "nvcc_cache"),
           "KLOOP_NVCC_CHECK_VERIFIED": str(run.root / "nvcc_checks"),
           "TRITON_CACHE_DIR": str(run.root / "triton"),
           # This evaluation's own: what one candidate's compiles leave reaches no other.
           "TORCHINDUCTOR_CACHE_DIR": str(run.root / "inductor")}
    if run.config.lean_cuda == "on":  # the compile child's and the candidate child's key
        env[lean.ENV] = "1"
    root = pch.store_dir() if run.config.pch != "off" else None
    if root is not None and pch.ready_keys(root):
        env[cxx_pch.ROOT_ENV] = str(root)
    if run.on_cpu:
        return env
    arch = cuda_arch_list(run.device)
    if arch:
        env["TORCH_CUDA_ARCH_LIST"] = arch
    return env


def reference_stage(run: EvalRun, before: Sequence[Finding] = (), job: ReferenceJob | None = None,
                    serving: Serving | None = None, warm_only: bool = False) -> list[Finding]:
    """Reference worker: probe-trial inputs (to the candidate's dir) and expected outputs (kept
    in the harness's memory only); then its served calls, timed by the harness: the handshake,
    the eager baseline and the expected output of every timed call; the compile baseline."""
    ledger = Ledger(run.root, before)
    ledger.record(Entered(stage="correctness"))
    key = server_key(run)  # the problem's, for the kept worker and the budget's estimate
    if job is None:  # an evaluation's (a given job is a kept worker's or a baselines-only run's)
        _kept_server(run, ledger, key)
        run.plan = budget.plan(run, key)  # before anything reads the timed calls' seeds
        job = reference_job(run)
    serving = serving or reference_serving(run)
    outputs_only = shared_reference(run, job)
    # Nothing of it is timed: the device held shared. A start compiles (torch.compile times
    # kernel choices as it does), so it never runs beside candidate code; outputs may.
    hold: HoldKind = "shared_trusted" if warm_only else "shared" if outputs_only else "exclusive"
    if hold != "exclusive":
        serving = dataclasses.replace(serving, outputs_only=outputs_only, warm_only=warm_only)
    env = {"TORCHINDUCTOR_CACHE_DIR": str(private_dir(run.config.cache_dir) / "inductor")}
    with ledger.timed("reference"), run.on_device(ledger, "reference", job, run.root / "ref",
                                                  ["reference", "baselines"], env,
                                                  serves=True, keep=job.paired,
                                                  hold=hold) as child:
        try:
            out = collect_reference(child, job, serving)
        finally:
            # It holds every trial's seeds; gone before the device lock (and with it the next
            # candidate's turn to run code) is given back.
            (run.root / "ref" / "job_reference.json").unlink(missing_ok=True)
    run.reference = out
    if outputs_only:
        assert run.server is not None
        _numbers_of(out, run.server.reference)
    # Trusted and at the full count: the budget's estimate for later evaluations of the problem
    # if none stands yet (a kept worker's is remembered by `_kept_server`, under its own label).
    elif not job.keep_serving and len(serving.seeds) == run.timing_spec(full=True).trials:
        budget.remember(key, out.eager,
                        "earlier_evaluation" if run.plan is not None else "warm_up")
    if out.parked:  # off the lock now, serving nothing until the candidate's timed calls
        run.ref_child = child
    ledger.record(*(Clocked(name=k, seconds=v) for k, v in out.stage_seconds.items()))
    kinds = baseline_kinds(run)
    # The compiled baselines' unpaired numbers and flags: a kept worker's, where one serves.
    compiled = run.server.reference if run.server is not None else out
    ledger.record(Observed(env=out.env),
                  Measured(what="eager", stats=_as_reference(out.eager) if "eager" in kinds else None),
                  Measured(what="compiled",
                           stats=_as_reference(compiled.compiled) if "compile" in kinds else None),
                  Measured(what="compiled_ro",
                           stats=_as_reference(compiled.compiled_ro)
                           if "compile_ro" in kinds else None),
                  *(Flagged(flag=f) for f in out.flags))
    return ledger.found


def shared_reference(run: EvalRun, job: ReferenceJob) -> bool:
    """Whether the reference worker takes the device shared (`EvalConfig.reference_hold`): only
    where it makes outputs and nothing else, a kept worker timing the baselines (eager only,
    ending after its stage, trusted code throughout). On CPU nothing is locked; the worker
    makes outputs only there too."""
    return (run.config.reference_hold == "shared"
            and run.server is not None and not job.paired and not job.keep_serving
            and job.baselines == ["eager"])


def _numbers_of(out: ReferenceOutput, alone: ReferenceOutput) -> None:
    """A shared hold's worker measured nothing: its eager baseline, handshake and the bounds
    the rounds use come from the kept worker's start (`alone`: measured alone, at the full
    count, on the same problem, device and settings)."""
    for f in ("eager", "handshake_ms", "null_call_ms", "calibrated_overhead_ms",
              "event_bound_ms"):
        setattr(out, f, getattr(alone, f))


def _kept_server(run: EvalRun, ledger: Ledger, key: str) -> None:
    """Pin a kept baseline worker for the paired rounds (`evaluator.harness.servers`), started
    now if this problem has none (its start, first use, is on this evaluation's clock); its
    flags (a compiled baseline that failed) are this evaluation's too."""
    from kloop.evaluator.harness.servers import SERVERS

    t0 = time.monotonic()
    run.server, started = SERVERS.ensure(run, key)
    if run.server is None:
        return
    # Its start timed eager at the full count (trusted code, before any candidate of this
    # problem was served by it): the budget's estimate if none stands yet.
    budget.remember(key, run.server.reference.eager, "kept_worker")
    if started:  # its lock holds are this evaluation's first use (`baseline_server_held`)
        ledger.clock("baseline_server_start", time.monotonic() - t0)
        ledger.clock("baseline_server_held", run.server.held_s)
        if run.server.shared_s:
            ledger.clock("baseline_server_shared", run.server.shared_s)
    ledger.record(*(Flagged(flag=f) for f in run.server.flags))


def _as_reference(stats: TimingStats | None) -> TimingStats | None:
    return None if stats is None else stats.model_copy(update={"measured_as": "reference"})


def reference_job(run: EvalRun) -> ReferenceJob:
    """What the reference worker does. `paired`: it stays after its own stage and serves its
    baselines again, interleaved with the candidate's timed calls (`harness.paired`). Where a
    kept worker serves the baselines (`run.server`), it serves eager only (the outputs every
    timed call is checked against) and ends after its stage."""
    kept = run.server is not None
    return ReferenceJob(
        problem=run.problem_spec(), trials=ref_trials(run),
        baselines=[b for b in baseline_kinds(run) if b == "eager"] if kept else baseline_kinds(run),
        timing=run.timing_spec(),
        fills_path=str(run.root / "cand" / "fills_main.pt")
        if run.policy.noisy_construction else None,
        served64=served64(run),
        paired=not kept,
    )


def reference_serving(run: EvalRun, rebuild: bool = False) -> Serving:
    spec = run.problem_spec()
    seeds = served_seeds(run)
    return Serving(
        seeds=seeds, timing=run.timing_spec(), on_cuda=not run.on_cpu,
        budget_s=run.config.timeouts.baselines,
        null_calls=null_call_count(run.on_cpu, len(seeds)),
        cache_dir=private_dir(run.config.cache_dir) / "baselines", rebuild=rebuild,
        key_extra={"policy": run.policy.name, "problem_sha256": spec.sha256,
                   "overrides": spec.overrides, "precision": spec.precision,
                   "allow_tf32": spec.allow_tf32, "input_scale": spec.input_scale, "input_shift": spec.input_shift,
                   "construction": "noisy" if spec.construction_seed is not None else "seed42"},
    )


def baseline_kinds(run: EvalRun) -> list[str]:
    mode = run.config.baselines
    if mode == "auto":
        mode = "eager" if run.on_cpu else "all"
    return {"none": [], "eager": ["eager"], "compile": ["compile"],
            "both": ["eager", "compile"], "all": ["eager", "compile", "compile_ro"]}[mode]


def candidate_stage(run: EvalRun, before: Sequence[Finding] = ()) -> list[Finding]:
    """Run the candidate child and judge what it produces, trial by trial (evaluator.harness.judge)."""
    ledger = Ledger(run.root, before)
    ledger.record(Entered(stage="load"))
    job = candidate_job(run, ledger, reference_job(run), build_dir(run))
    from kloop.evaluator.harness.headtohead import one_hold, start_incumbent

    with one_hold(run, ledger):
        if run.incumbent is not None:
            start_incumbent(run, ledger, job, _candidate_env(run))
        done, outcome = _candidate_children(run, ledger, job)
    ledger.mark(None)
    if ledger.verdict.status is None and not done:
        ledger.record(child_failure(outcome, STAGE_OF_CHILD.get(outcome.stage, "load"), run.config))
    if ledger.verdict.status is None:
        final_verdict(run, ledger, job)
    if ledger.verdict.status == "correct" and run.config.ncu and not run.on_cpu:
        with run.gpu_lock(), ledger.timed("ncu"):
            _ncu_pass(run, ledger, job)
    return ledger.found


def _candidate_children(run: EvalRun, ledger: Ledger,
                        job: CandidateJob) -> tuple[bool, ChildOutcome]:
    """The candidate child built ahead where it can be, else (or when that one asks to be
    judged again) one that builds under the lock."""
    judged = None
    if construct_ahead(run, ledger):
        ahead_job = job.model_copy(update={"construct_ahead": True,
                                           "ahead_hidden": run.ahead_paths()})
        judged = _candidate_child(run, ledger, ahead_job)
        if isinstance(judged, str):
            ledger.record(Flagged(flag=f"constructed_under_lock: {judged}"))
            # What the static rules judged, whatever that child left in its dir.
            write_new(run.root / "cand" / "candidate.py", run.source)
    if not isinstance(judged, tuple):
        judged = _candidate_child(run, ledger, job)
    return judged


def construct_ahead(run: EvalRun, ledger: Ledger) -> bool:
    """Whether the candidate child builds its models before the lock (`EvalConfig.construct_at`)."""
    mode = run.config.construct_at
    if mode == "under_lock":
        return False
    if run.can_construct_ahead:
        return True
    if mode == "before_lock":
        ledger.record(Flagged(flag="construct_before_lock_unavailable"))
    return False


def _candidate_child(run: EvalRun, ledger: Ledger,
                     job: CandidateJob) -> tuple[bool, ChildOutcome] | str:
    """One candidate child, judged message by message: (whether it said done, how it ended).
    A child built ahead whose candidate must be judged again in a new child: why (nothing of
    it was judged; it never reported past `ready`, or only that the device is unusable)."""
    seq = MessageOrder()
    done = False
    with ledger.timed("candidate"), run.on_device(
            ledger, "candidate", job, run.root / "cand",
            ["load", "correctness", "timing", "profile", "compile"], _candidate_env(run),
            serves=True, mask=[run.root / "inc"] if run.incumbent is not None else None,
            hold="candidate" if run.config.candidate_hold == "untimed_shared" else "exclusive"
    ) as child:
        if job.construct_ahead and (why := _retry(child)) is not None:
            child.kill("retry")
            return why
        if job.construct_ahead and not child.said_ahead:
            # Its trusted start found a hidden path uncovered or no SCHED_IDLE (a host that
            # refused a mount or the policy): it builds under the lock, as it must. Judged the
            # same; said, since it costs the lock what the build ahead is for.
            ledger.record(Flagged(flag="construct_before_lock_unavailable: the child was not kept "
                                       "from the device, so it built under the lock"))
        t0 = time.monotonic()
        first = True
        for msg in child.messages():
            got = time.monotonic()
            if isinstance(msg, RetryMsg) and first and job.construct_ahead:
                child.kill("retry")
                return f"the device was unusable in its process: {msg.reason[:300]}"
            first = False
            done = on_message(run, ledger, job, seq, child, msg) or done
            if log.isEnabledFor(logging.DEBUG):  # nothing more under the lock otherwise
                _trace(run, msg, got - t0, time.monotonic() - got)
        outcome = child.outcome()
    return done, outcome


def _retry(child: Child) -> str | None:
    """Why a child built ahead never got `go`: it failed before the lock (whatever way: an
    error, a crash, out of time or memory), or the device could not be given to it."""
    if child.retry is not None:
        return child.retry
    if child.ready_at is None:
        out = child.outcome()
        return f"it ended before the lock ({out.killed_for or f'exit code {out.returncode}'})"
    return None


def _trace(run: EvalRun, msg: object, at: float, judged: float) -> None:
    """Where a candidate's time under the lock goes, message by message: when each arrived and
    how long judging it took (bench/throughput.py --trace)."""
    what = next((getattr(msg, a) for a in ("stage", "probe", "index")
                 if getattr(msg, a, None) is not None), "")
    log.debug("%s %s %s %s: at %.3f s, judged in %.3f s", run.root.name, run.problem.id,
              type(msg).__name__, what, at, judged)


def _ncu_pass(run: EvalRun, ledger: Ledger, job: CandidateJob) -> None:
    """Nsight Compute metrics for the custom kernels that dominate the profile (optional
    feedback), from one ncu run. Its wall time is `stage_seconds["ncu"]`: part of the
    evaluation's, and so of the agent's `eval_s` budget."""
    from kloop.evaluator.harness.ncu import dominant_custom_kernels, ncu_kernel_metrics

    profile = ledger.verdict.profile
    if profile is None:
        return
    targets = dominant_custom_kernels(profile, run.config.ncu_kernels)
    if not targets:
        return
    workdir = run.root / "cand"
    job_path = workdir / "job_forward.json"
    write_new(job_path, job.model_dump_json())  # the candidate child ran in this dir
    cmd, env = forward_command(run, job_path)
    metrics = ncu_kernel_metrics(cmd, targets, env, run.config.timeouts.profile)
    if not metrics:
        ledger.record(Flagged(flag="ncu_unavailable"))
        return
    ledger.record(Profiled(summary=profile.model_copy(
        update={"ncu": metrics[0], "ncu_kernels": metrics})))


def forward_command(run: EvalRun, job_path: Path) -> tuple[list[str], dict[str, str]]:
    """The ncu pass's child: ncu starts it (as the harness's uid), so it takes on the
    candidate's sandbox identity itself before any candidate code runs (`confine_child`)."""
    cmd = [sys.executable, "-m", "kloop.evaluator.worker.child", "forward", str(job_path), "-1"]
    env = child_env(run.root / "cand" / "home", run.device,
                    {**_candidate_env(run), **identity_env(run.sandbox)})
    return cmd, env


def _candidate_env(run: EvalRun) -> dict[str, str]:
    env = _build_env(run)
    if run.on_cpu:
        env["TRITON_INTERPRET"] = "1"
    return env
