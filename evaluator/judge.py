"""The harness's side of the candidate stage: which trials the candidate child runs, what each
of its messages means, and the final verdict. Every verdict is made here, in the harness, from
outputs compared against expected outputs the candidate process never held.

Trials, in order (indices shared with the reference worker): `random` (fresh salted inputs;
the first also counts kernel launches and is called twice for determinism, the last is preceded
by a ghost-kernel call), `scaled_inputs` (a degenerate problem's probe), `reparam` (re-randomised
parameters on both sides; skipped when the candidate's parameter layout differs), then `refill`
(inside the timing loop, in the tensors of the previous timed call) and `post_timing`.
"""

from __future__ import annotations

import base64
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from evaluator.checks import (
    determinism,
    is_degenerate,
    probe_violations,
    trial_violations,
    violate,
)
from evaluator.correctness import compare_outputs
from evaluator.protocol import (
    AwaitMsg,
    CandidateJob,
    CandTrial,
    CompileMsg,
    Control,
    DoneMsg,
    EnvMsg,
    ErrorMsg,
    FlagMsg,
    NeedMsg,
    ProbeMsg,
    ProfileMsg,
    ReferenceJob,
    RefTrial,
    StageMsg,
    TimingMsg,
    TrialMsg,
)
from evaluator.result import CorrectnessTrial, ErrorInfo, OutputDiff
from evaluator.state import EvalRun, derive_seed

STAGE_OF_CHILD = {
    "startup": "load", "load": "load", "compile": "compile", "correctness": "correctness",
    "timing": "timing", "profile": "profile",
}
_MAX_OUTPUT_SLACK = 1 << 20
_BEFORE_TIMING = ("random", "scaled_inputs", "reparam")


def trial_kinds(run: EvalRun) -> list[str]:
    p, meta = run.policy, run.problem.meta
    probe = meta.degenerate_probe if p.degenerate_trials and is_degenerate(run) else None
    kinds = ["random"] * p.correct_trials
    if probe == "scaled_inputs":
        kinds.append("scaled_inputs")
    if p.reparam_trial or probe == "reparam":
        kinds.append("reparam")
    if p.interleaved_check:
        kinds.append("refill")
    if p.post_timing_check:
        kinds.append("post_timing")
    return kinds


def ref_trials(run: EvalRun) -> list[RefTrial]:
    cand = run.root / "cand"
    return [
        RefTrial(
            index=k, kind=kind, input_seed=derive_seed(run.salt, "input", k),
            forward_seed=derive_seed(run.salt, "forward", k),
            # The refill trial's inputs stay with the harness until the trial starts.
            inputs_path=str(run.root / ("ref" if kind == "refill" else "cand") / f"inputs_{k}.pt"),
            expected_path=str(run.root / "ref" / f"expected_{k}.pt"),
            perturb_seed=derive_seed(run.salt, "perturb", k) if kind == "reparam" else None,
            layout_path=str(cand / f"layout_{k}.json") if kind == "reparam" else None,
            input_scale=run.problem.meta.degenerate_input_scale
            if kind == "scaled_inputs" else None,
        )
        for k, kind in enumerate(trial_kinds(run))
    ]


def candidate_job(run: EvalRun, ref: ReferenceJob, build_dir: Path) -> CandidateJob:
    cand = run.root / "cand"
    kernels = run.backend not in (None, "torch")
    ghost = _ghost_index(run, ref) if kernels else None
    if kernels and ghost is None:
        run.flags.append("ghost_check_skipped")
    trials = [
        CandTrial(
            index=t.index, kind=t.kind, forward_seed=t.forward_seed, inputs_path=t.inputs_path,
            output_path=str(cand / f"output_{t.index}.pt"),
            perturb_seed=t.perturb_seed, layout_path=t.layout_path,
            repeat_output_path=str(cand / "output_repeat.pt") if t.index == 0 else None,
            count_launches=kernels and t.index == 0,
            ghost=t.index == ghost,
            inputs_from_harness=t.kind == "refill",
        )
        for t in ref.trials
    ]
    by_kind = {t.kind: t for t in trials}
    mem = int(run.config.cpu_memory_limit_gb * (1 << 30)) if run.on_cpu else None
    return CandidateJob(
        problem=run.problem_spec(), candidate_path=str(cand / "candidate.py"),
        backend=run.backend or "torch", trials=[t for t in trials if t.kind in _BEFORE_TIMING],
        post_timing=by_kind.get("post_timing"), refill=by_kind.get("refill"),
        timing=run.timing_spec(run.salt), profile=run.config.profile, ncu=run.config.ncu,
        memory_limit_bytes=mem, cpu_emulation=run.on_cpu and run.backend == "triton",
        triton_aot=run.config.triton_aot, build_dir=str(build_dir),
        tolerance=run.policy.tolerance(run.config.precision),
    )


def hold_inputs(run: EvalRun, job: CandidateJob) -> dict[int, bytes]:
    """Take the inputs of harness-held trials off the disk into memory (before the candidate
    child starts): the candidate sees them only when the trial runs."""
    held = {}
    for t in [*job.trials, job.refill, job.post_timing]:
        if t is not None and t.inputs_from_harness:
            path = Path(t.inputs_path)
            held[t.index] = path.read_bytes()
            path.unlink()
    return held


def _ghost_index(run: EvalRun, ref: ReferenceJob) -> int | None:
    """The trial preceded by the ghost call: one whose inputs no earlier call saw, on the model
    the earlier calls used (a fresh model would build its lazy state with stubbed kernels).
    The last random trial; but where the output does not depend on the input, every earlier
    call left the right answer in memory, and only the scaled-inputs trial will do."""
    kinds = [t.kind for t in ref.trials]
    if is_degenerate(run):
        return kinds.index("scaled_inputs") if "scaled_inputs" in kinds else None
    randoms = [t.index for t in ref.trials if t.kind == "random"]
    return randoms[-1] if randoms else None


@dataclass
class Sequence:
    """What the candidate child has said so far: its result pipe is writable by candidate code,
    so a message out of order (a second timing, a trial twice, anything after `done`) is a
    forgery, never a glitch."""

    held: dict[int, bytes] = field(default_factory=dict)
    control: str | None = None
    seen: set[str] = field(default_factory=set)
    done: bool = False


def _out_of_sequence(seq: Sequence, msg: Any, job: CandidateJob) -> str | None:
    once = {AwaitMsg: "await", ProfileMsg: "profile", DoneMsg: "done"}
    if seq.done:
        return f"a {msg.kind} message after done"
    if isinstance(msg, TimingMsg):
        if msg.name != "candidate" or seq.control != "time" or "timing" in seq.seen:
            return f"a {msg.name} timing record it was not asked for"
        seq.seen.add("timing")
    elif isinstance(msg, EnvMsg):
        return "an environment record (only the reference worker sends one)"
    elif type(msg) in once:
        key = once[type(msg)]
        if key in seq.seen:
            return f"a second {key} message"
        seq.seen.add(key)
    elif isinstance(msg, TrialMsg | NeedMsg):
        timed = {t.index for t in (job.refill, job.post_timing) if t is not None}
        if msg.index in timed and seq.control != "time":
            return f"a message for trial {msg.index} before timing was allowed"
        if isinstance(msg, NeedMsg) and msg.index not in seq.held:
            return f"a request for inputs of trial {msg.index} it cannot have"
    return None


def _serve(seq: Sequence, child: Any, index: int) -> None:
    data = seq.held.pop(index)
    child.send(Control(next="inputs", data=base64.b64encode(data).decode()))


def on_message(run: EvalRun, job: CandidateJob, seq: Sequence, child: Any, msg: Any) -> bool:
    """Judge one message of the candidate child; True once it reported it is done."""
    problem = _out_of_sequence(seq, msg, job)
    if problem is not None:
        run.violations.append(violate(run, "protocol_violation", f"the candidate process sent "
                                      f"{problem}"))
        if isinstance(msg, NeedMsg | AwaitMsg):
            child.send(Control(next="stop"))
        return False
    if isinstance(msg, NeedMsg):
        _serve(seq, child, msg.index)
    elif isinstance(msg, StageMsg):
        run.reach(STAGE_OF_CHILD.get(msg.stage, run.stage))  # type: ignore[arg-type]
        run.mark(msg.stage)
    elif isinstance(msg, FlagMsg):
        run.flags.append(msg.flag)
    elif isinstance(msg, ErrorMsg):
        run.stop(msg.status, STAGE_OF_CHILD.get(msg.stage, run.stage), msg.error)  # type: ignore[arg-type]
    elif isinstance(msg, TrialMsg):
        _judge_trial(run, job, msg)
    elif isinstance(msg, ProbeMsg):
        run.violations += probe_violations(run, msg)
    elif isinstance(msg, AwaitMsg):
        go = _all_passed(run, job) and not rejected(run) and not compile_failed(run)
        seq.control = "time" if go else "stop"
        child.send(Control(next=seq.control))
    elif isinstance(msg, TimingMsg) and msg.name == "candidate":
        run.timing = msg.stats
    elif isinstance(msg, ProfileMsg):
        run.profile = msg.summary
    elif isinstance(msg, CompileMsg):
        run.compile = msg.log
    elif isinstance(msg, DoneMsg):
        seq.done = True
        return True
    return False


def _trial_spec(job: CandidateJob, index: int) -> CandTrial | None:
    for t in [*job.trials, job.refill, job.post_timing]:
        if t is not None and t.index == index:
            return t
    return None


def _judge_trial(run: EvalRun, job: CandidateJob, msg: TrialMsg) -> None:
    spec = _trial_spec(job, msg.index)
    if spec is None or any(t.trial == msg.index for t in run.trials) or \
            msg.index in run.skipped_trials:
        run.violations.append(violate(run, "protocol_violation", f"the candidate process sent "
                                      f"trial {msg.index}, which is unknown or already judged"))
        return
    if msg.skipped is not None:
        if spec.perturb_seed is None:  # only the reparam trial may be skipped
            run.violations.append(violate(run, "protocol_violation", f"trial {msg.index} "
                                          "claimed to be skipped"))
            return
        run.skipped_trials[msg.index] = msg.skipped
        run.flags.append(f"{spec.kind}_skipped")
        return
    assert run.reference is not None
    expected = run.reference.expected[msg.index]
    tol = run.policy.tolerance(run.config.precision)
    got, problem = load_output(Path(spec.output_path), expected)
    if problem is not None:
        diffs = [OutputDiff(ok=False, expected_shape=list(expected[0].shape),
                            expected_dtype=str(expected[0].dtype), message=problem)]
    else:
        diffs = compare_outputs(expected, got, msg.output_types, tol)
    if any(d.got_type for d in diffs):
        run.flags.append("non_tensor_output")
    passed = all(d.ok for d in diffs)
    run.trials.append(CorrectnessTrial(
        trial=msg.index, kind=spec.kind, passed=passed, outputs=diffs,
        message=None if passed else next((d.message for d in diffs if not d.ok), None)))
    run.violations += trial_violations(run, msg)
    if spec.repeat_output_path is not None and passed:
        again, problem = load_output(Path(spec.repeat_output_path), expected)
        if problem is None:
            run.violations += determinism(run, got, again, tol)


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


def _all_passed(run: EvalRun, job: CandidateJob) -> bool:
    judged = {t.trial: t.passed for t in run.trials}
    return all(judged.get(t.index, False) for t in job.trials if t.index not in run.skipped_trials)


def compile_failed(run: EvalRun) -> bool:
    return run.compile is not None and not run.compile.ok and not run.compile.infra_error


def rejected(run: EvalRun) -> bool:
    return any(v.severity == "reject" for v in run.violations)


def first_diagnostic(run: EvalRun) -> str:
    log_ = run.compile
    if log_ is None or not log_.diagnostics:
        return "compilation failed"
    d = log_.diagnostics[0]
    return f"{d.file or '?'}:{d.line or '?'}: {d.message}"


def final_verdict(run: EvalRun, job: CandidateJob) -> None:
    expected = [t.index for t in job.trials if t.index not in run.skipped_trials]
    if run.timing is not None:
        expected += [t.index for t in (job.refill, job.post_timing) if t is not None]
    judged = {t.trial: t for t in run.trials}
    missing = [k for k in expected if k not in judged]
    if compile_failed(run):
        run.stop("compile_error", "compile", ErrorInfo(
            type="CompileError", message=first_diagnostic(run)))
    elif rejected(run):
        run.stop("rejected", run.stage)
    elif missing or not all(judged[k].passed for k in expected):
        if missing:
            run.error = ErrorInfo(type="MissingTrials", message=f"trials {missing} never ran")
        run.stop("incorrect", run.stage)
    elif run.backend == "torch" and run.policy.require_custom_kernel:
        run.violations.append(violate(run, "no_custom_kernel", "plain PyTorch: the candidate "
                                      "defines no kernel of its own", severity="reject"))
        run.stop("rejected", "done")
    else:
        run.stop("correct", "done")
