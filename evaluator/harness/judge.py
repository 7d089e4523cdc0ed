"""The harness's side of the candidate stage: which probe trials the candidate child runs, what
each of its messages means, the timed calls, and the final verdict. Every verdict is made here,
in the harness, from outputs compared against expected outputs the candidate process never held,
and every number comes from the harness's own clock (`evaluator.harness.clock`).

Probe trials, in order (indices shared with the reference worker): `random` (fresh salted
inputs; the first also counts kernel launches, is called twice for determinism and carries the
float64 precision check, the last is preceded by a ghost-kernel call), `reparam` (a second model
built under another secret seed on both sides; never skipped). Then the timed calls: each on a
fresh secret seed, each output checked against the reference's for that seed.
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from kloop.evaluator.common.correctness import compare_outputs
from kloop.evaluator.common.protocol import (
    AwaitMsg,
    CallProblemMsg,
    CandidateJob,
    CandTrial,
    CompileMsg,
    Control,
    DoneMsg,
    EnvMsg,
    ErrorMsg,
    FlagMsg,
    ProbeMsg,
    ProfileMsg,
    ReadyMsg,
    ReferenceJob,
    RefTrial,
    RetryMsg,
    Sample,
    Served64,
    ServeMsg,
    StageMsg,
    TimingMsg,
    TrialMsg,
)
from kloop.evaluator.common.result import CorrectnessTrial, ErrorInfo, OutputDiff
from kloop.evaluator.harness.checks import (
    determinism,
    is_degenerate,
    probe_violations,
    trial_violations,
    violate,
)
from kloop.evaluator.harness.cputhreads import judging_thread
from kloop.evaluator.harness.ledger import Ledger
from kloop.evaluator.harness.outcome import (
    Built,
    Clocked,
    Decided,
    Flagged,
    Judged,
    Profiled,
    Reached,
    Verdict,
    violated,
)
from kloop.evaluator.harness.paired import first_half
from kloop.evaluator.harness.precision import precision_check
from kloop.evaluator.harness.state import EvalRun, derive_seed
from kloop.evaluator.harness.timed import note_call_problem, timed_calls

STAGE_OF_CHILD = {
    "startup": "load", "load": "load", "compile": "compile", "correctness": "correctness",
    "timing": "timing", "profile": "profile",
}
_MAX_OUTPUT_SLACK = 1 << 20


def trial_kinds(run: EvalRun) -> list[str]:
    p, meta = run.policy, run.problem.meta
    probe = meta.degenerate_probe if p.degenerate_trials and is_degenerate(run) else None
    kinds = ["random"] * p.correct_trials
    if p.reparam_trial or probe == "reparam":
        kinds.append("reparam")
    return kinds


def precision_checked(run: EvalRun) -> bool:
    return run.policy.precision_factor is not None and run.config.precision == "fp32"


def ref_trials(run: EvalRun) -> list[RefTrial]:
    cand, ref = run.root / "cand", run.root / "ref"
    return [
        RefTrial(
            index=k, kind=kind, input_seed=derive_seed(run.salt, "input", k),
            forward_seed=derive_seed(run.salt, "forward", k),
            inputs_path=str(cand / f"inputs_{k}.pt"),
            expected_path=str(ref / f"expected_{k}.pt"),
            perturb_seed=derive_seed(run.salt, "perturb", k) if kind == "reparam" else None,
            fills_path=str(cand / f"fills_{k}.pt") if kind == "reparam" else None,
            fp64_path=str(ref / f"expected64_{k}.pt") if k == 0 and precision_checked(run)
            else None,
            fp64_sample=precision_sample(run) if k == 0 else None,
        )
        for k, kind in enumerate(trial_kinds(run))
    ]


def precision_sample(run: EvalRun) -> Sample | None:
    """Where large float64 outputs are kept (`evaluator.common.sample`): secret positions drawn
    from the run's salt, the same for every float64 output of the evaluation."""
    p = run.policy
    if not precision_checked(run) or p.precision_sample_above is None:
        return None
    return Sample(seed=derive_seed(run.salt, "precision_sample", 0), above=p.precision_sample_above,
                  size=p.precision_sample)


def served_seeds(run: EvalRun) -> list[int]:
    """The timed calls' seeds: secret to every process but the harness and the reference."""
    return [derive_seed(run.salt, "served", i) for i in range(run.timing_spec().trials)]


PRECISION_CALLS = 3
"""Timed calls whose outputs are also checked against float64, chosen in secret per
evaluation: a kernel that lowers its precision in a share f of the timed calls escapes with
probability (1 - f)^3, and one that does so in every timed call never does."""


def served64(run: EvalRun) -> list[Served64]:
    """Which timed calls carry the precision check, drawn from the run's secret salt (the same
    every time this evaluation asks), with where the reference worker writes their float64
    outputs (harness-private)."""
    if not precision_checked(run):
        return []
    seeds = served_seeds(run)
    rng = random.Random(derive_seed(run.salt, "precision", 0))
    half = first_half(len(seeds)) if run.policy.timing_stop_width is not None else None
    if half is None:
        pick = rng.sample(range(len(seeds)), min(PRECISION_CALLS, len(seeds)))
    else:  # the sequential rule may stop after the first half: it holds a full check
        pick = rng.sample(range(half), min(PRECISION_CALLS, half)) + \
            rng.sample(range(half, len(seeds)), min(PRECISION_CALLS, len(seeds) - half))
    return [Served64(index=i, seed=seeds[i], path=str(run.root / "ref" / f"served64_{i}.pt"),
                     sample=precision_sample(run))
            for i in sorted(pick)]


def candidate_job(run: EvalRun, ledger: Ledger, ref: ReferenceJob, build_dir: Path) -> CandidateJob:
    cand = run.root / "cand"
    kernels = ledger.verdict.backend not in (None, "torch")
    ghost = _ghost_index(run, ref) if kernels else None
    if kernels and ghost is None:
        ledger.record(Flagged(flag="ghost_check_skipped"))
    trials = [
        CandTrial(
            index=t.index, kind=t.kind, forward_seed=t.forward_seed, inputs_path=t.inputs_path,
            output_path=str(cand / f"output_{t.index}.pt"),
            perturb_seed=t.perturb_seed, fills_path=t.fills_path,
            repeat_output_path=str(cand / "output_repeat.pt") if t.index == 0 else None,
            count_launches=kernels and t.index == 0,
            ghost=t.index == ghost,
        )
        for t in ref.trials
    ]
    mem = int(run.config.cpu_memory_limit_gb * (1 << 30)) if run.on_cpu else None
    return CandidateJob(
        problem=run.problem_spec(), candidate_path=str(cand / "candidate.py"),
        backend=ledger.verdict.backend or "torch", trials=trials, fills_path=ref.fills_path,
        timing=run.timing_spec(), profile=run.config.profile, ncu=run.config.ncu,
        profile_trials=run.config.profile_trials,
        memory_limit_bytes=mem, cpu_emulation=run.on_cpu and ledger.verdict.backend == "triton",
        triton_aot=run.config.triton_aot, build_dir=str(build_dir),
        tolerance=run.policy.tolerance(run.config.precision),
    )


def _ghost_index(run: EvalRun, ref: ReferenceJob) -> int | None:
    """The trial preceded by the ghost call: one whose inputs no earlier call saw, on the model
    the earlier calls used (a fresh model would build its lazy state with stubbed kernels).
    The last random trial; but where the output does not depend on the input (a degenerate
    problem not scaled into dependence), every earlier call left the right answer in memory."""
    if is_degenerate(run) and run.problem_spec().input_scale is None:
        return None
    randoms = [t.index for t in ref.trials if t.kind == "random"]
    return randoms[-1] if randoms else None


@dataclass
class MessageOrder:
    """What the candidate child has said so far: its result pipe is writable by candidate code,
    so a message out of order (a second timing, a trial twice, anything after `done`) is a
    forgery, never a glitch."""

    control: str | None = None
    seen: set[str] = field(default_factory=set)
    done: bool = False
    last_at: float | None = None
    """When the harness took its last message (the correctness stage's parts are the gaps)."""


def _out_of_sequence(seq: MessageOrder, msg: Any, job: CandidateJob) -> str | None:
    once = {AwaitMsg: "await", ProfileMsg: "profile", DoneMsg: "done"}
    if seq.done:
        return f"a {msg.kind} message after done"
    if isinstance(msg, ReadyMsg):
        return "a second ready message (the harness took the first before any candidate code ran)"
    if isinstance(msg, RetryMsg):
        return "a retry request after its first message (only the first can ask for it)"
    if isinstance(msg, TimingMsg):
        return "a timing record (only the harness's clock times anything)"
    elif isinstance(msg, ServeMsg):
        return "a serve request (the harness decides when the candidate serves calls)"
    elif isinstance(msg, EnvMsg):
        return "an environment record (only the reference worker sends one)"
    elif type(msg) in once:
        key = once[type(msg)]
        if key in seq.seen:
            return f"a second {key} message"
        seq.seen.add(key)
    return None


def on_message(run: EvalRun, ledger: Ledger, job: CandidateJob, seq: MessageOrder, child: Any,
               msg: Any) -> bool:
    """Judge one message of the candidate child; True once it reported it is done."""
    now = time.monotonic()
    gap, seq.last_at = (now - seq.last_at if seq.last_at is not None else None), now
    # Only gaps inside the child's own correctness stage (the verdict's stage is `correctness`
    # from the reference stage on, so a probe the child sent while loading would be counted).
    if gap is not None and ledger.since_mark("correctness") is not None:
        _clock_part(ledger, job, msg, gap)
    problem = _out_of_sequence(seq, msg, job)
    if problem is not None:
        ledger.record(*violated(violate(run, "protocol_violation", f"the candidate process sent "
                                       f"{problem}")))
        if isinstance(msg, AwaitMsg):
            child.send(Control(next="stop"))
        return False
    if isinstance(msg, StageMsg):
        ledger.record(Reached(stage=STAGE_OF_CHILD.get(msg.stage, ledger.verdict.stage)))  # type: ignore[arg-type]
        ledger.mark(msg.stage)
    elif isinstance(msg, FlagMsg):
        ledger.record(Flagged(flag=msg.flag))
    elif isinstance(msg, ErrorMsg):
        ledger.record(Decided(status=msg.status,  # type: ignore[arg-type]
                              stage=STAGE_OF_CHILD.get(msg.stage, ledger.verdict.stage),
                              error=msg.error))
    elif isinstance(msg, TrialMsg):
        if not ledger.verdict.trials and (t := ledger.since_mark("correctness")) is not None:
            # The first trial alone (it counts launches: under the profiler for CUDA sources
            # on a GPU): where the correctness stage's time goes, for bench/throughput.py.
            ledger.record(Clocked(name="first_trial", seconds=t))
        t0 = time.monotonic()
        with judging_thread():
            _judge_trial(run, ledger, job, msg)
        ledger.record(Clocked(name="trials_judged", seconds=time.monotonic() - t0))
        seq.last_at = time.monotonic()  # the child's next gap starts after the harness's part
    elif isinstance(msg, ProbeMsg):
        ledger.record(*violated(*probe_violations(run, ledger, msg)))
    elif isinstance(msg, AwaitMsg):
        v = ledger.verdict
        go = _all_passed(v, job) and not rejected(v) and not compile_failed(v)
        seq.control = "time" if go and job.timing is not None else "stop"
        if seq.control == "time":
            timed_calls(run, ledger, child, served_seeds(run))
        else:
            child.send(Control(next="stop"))
    elif isinstance(msg, CallProblemMsg):
        note_call_problem(ledger, msg.message)
    elif isinstance(msg, ProfileMsg):
        ledger.record(Profiled(summary=msg.summary))
    elif isinstance(msg, CompileMsg):
        # The compile stage's log says how the source was built (nvcc's diagnostics, the split);
        # loading the store's verified copy only adds news when it failed or built something
        # the compile stage did not.
        if ledger.verdict.compile is None or not (msg.log.ok and msg.log.cache_hit):
            ledger.record(Built(log=msg.log))
    elif isinstance(msg, DoneMsg):
        seq.done = True
        return True
    return False


def _clock_part(ledger: Ledger, job: CandidateJob, msg: Any, gap: float) -> None:
    """Where the correctness stage's time goes, for the benches (never a verdict: the gaps are
    the candidate process's to shape): the child's time before each trial (`trial_<kind>`),
    before each probe's report (`probes`) and before it asks to be timed (`trials_after`)."""
    if isinstance(msg, TrialMsg):
        spec = _trial_spec(job, msg.index)
        ledger.record(Clocked(name=f"trial_{spec.kind if spec else 'unknown'}", seconds=gap))
    elif isinstance(msg, ProbeMsg):
        ledger.record(Clocked(name="probes", seconds=gap))
    elif isinstance(msg, AwaitMsg):
        ledger.record(Clocked(name="trials_after", seconds=gap))


def _trial_spec(job: CandidateJob, index: int) -> CandTrial | None:
    return next((t for t in job.trials if t.index == index), None)


def _judge_trial(run: EvalRun, ledger: Ledger, job: CandidateJob, msg: TrialMsg) -> None:
    spec = _trial_spec(job, msg.index)
    if spec is None or any(t.trial == msg.index for t in ledger.verdict.trials):
        ledger.record(*violated(violate(run, "protocol_violation", f"the candidate process sent "
                                       f"trial {msg.index}, which is unknown or already judged")))
        return
    assert run.reference is not None
    expected = run.reference.expected.pop(msg.index)  # a trial is judged once: drop it after
    tol = run.policy.tolerance(run.config.precision)
    got, problem = load_output(Path(spec.output_path), expected)
    if problem is not None:
        diffs = [OutputDiff(ok=False, expected_shape=list(expected[0].shape),
                            expected_dtype=str(expected[0].dtype), message=problem)]
    else:
        diffs = compare_outputs(expected, got, msg.output_types, tol)
    if any(d.got_type for d in diffs):
        ledger.record(Flagged(flag="non_tensor_output"))
    passed = all(d.ok for d in diffs)
    ledger.record(Judged(trial=CorrectnessTrial(
        trial=msg.index, kind=spec.kind, passed=passed, outputs=diffs,
        message=None if passed else next((d.message for d in diffs if not d.ok), None))))
    ledger.record(*violated(*trial_violations(run, ledger, msg)))
    if passed and msg.index in run.reference.expected64:
        precision_check(run, ledger, got, expected, run.reference.expected64[msg.index])
    if spec.repeat_output_path is not None and passed:
        again, problem = load_output(Path(spec.repeat_output_path), expected)
        if problem is None:
            ledger.record(*violated(*determinism(run, got, again, tol)))


def load_output(path: Path, expected: list[Any]) -> tuple[list[Any], str | None]:
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


def _all_passed(v: Verdict, job: CandidateJob) -> bool:
    judged = {t.trial: t.passed for t in v.trials}
    return all(judged.get(t.index, False) for t in job.trials)


def compile_failed(v: Verdict) -> bool:
    return v.compile is not None and not v.compile.ok and not v.compile.infra_error


def rejected(v: Verdict) -> bool:
    return any(x.severity == "reject" for x in v.violations)


def first_diagnostic(v: Verdict) -> str:
    log_ = v.compile
    if log_ is None or not log_.diagnostics:
        return "compilation failed"
    d = log_.diagnostics[0]
    return f"{d.file or '?'}:{d.line or '?'}: {d.message}"


def final_verdict(run: EvalRun, ledger: Ledger, job: CandidateJob) -> None:
    v = ledger.verdict
    expected = [t.index for t in job.trials]
    judged = {t.trial: t for t in v.trials}
    missing = [k for k in expected if k not in judged]
    timed_failed = any(not t.passed for t in v.trials if t.kind == "timed")
    if compile_failed(v):
        ledger.stop("compile_error", "compile", ErrorInfo(
            type="CompileError", message=first_diagnostic(v)))
    elif rejected(v):
        ledger.stop("rejected", v.stage)
    elif missing or timed_failed or not all(judged[k].passed for k in expected):
        ledger.stop("incorrect", v.stage, ErrorInfo(
            type="MissingTrials", message=f"trials {missing} never ran") if missing else None)
    elif job.timing is not None and v.timing is None:
        ledger.stop("runtime_error", "timing", v.error or ErrorInfo(
            type="NoTiming", message="the timed calls did not complete"))
    elif v.backend == "torch" and run.policy.require_custom_kernel:
        ledger.record(*violated(violate(run, "no_custom_kernel", "plain PyTorch: the candidate "
                                       "defines no kernel of its own", severity="reject")))
        ledger.stop("rejected", "done")
    else:
        ledger.stop("correct", "done")
