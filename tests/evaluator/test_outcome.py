"""The rules by which findings become a verdict (`evaluator.harness.outcome.fold`), on a real
EvalRun's ledger; and how stages hand their findings to the pipeline."""

from __future__ import annotations

import pytest
from eval_helpers import cpu_config

from kloop.evaluator.common.result import CorrectnessTrial, ErrorInfo, TimingStats, Violation
from kloop.evaluator.harness.ledger import Ledger
from kloop.evaluator.harness.outcome import (
    Decided,
    Entered,
    Flagged,
    Judged,
    Measured,
    Noted,
    Reached,
    violated,
)
from kloop.evaluator.harness.state import EvalRun, result_of
from kloop.problems.registry import get_problem


@pytest.fixture
def run(tmp_path):
    r = EvalRun.create(get_problem("L3/1"), "", cpu_config(tmp_path / "cache"))
    yield r
    r.cleanup()


@pytest.fixture
def ledger(run):
    return Ledger(run.root)


def test_the_first_verdict_stands_with_its_stage_and_error(run, ledger):
    ledger.record(Entered(stage="timing"),
                  Decided(status="incorrect", stage="timing"),
                  Decided(status="runtime_error", stage="load",
                          error=ErrorInfo(type="SIGKILL", message="killed after the verdict")))
    assert (ledger.verdict.status, ledger.verdict.stage, ledger.verdict.error) == ("incorrect", "timing", None)


def test_stages_move_forward_only_from_children_and_stay_once_decided(run, ledger):
    ledger.record(Entered(stage="correctness"), Reached(stage="load"))
    assert ledger.verdict.stage == "correctness"  # a child's report never moves it back
    ledger.record(Reached(stage="timing"))
    assert ledger.verdict.stage == "timing"
    ledger.record(Entered(stage="load"))  # the harness starting a stage sets it
    assert ledger.verdict.stage == "load"
    ledger.record(Decided(status="rejected", stage="static"), Reached(stage="done"),
                  Entered(stage="timing"))
    assert ledger.verdict.stage == "static"


def test_runtime_violations_raise_their_flag_and_static_ones_do_not(run, ledger):
    v = Violation(rule="deferred_work", severity="reject", message="m")
    w = Violation(rule="dynamic_code", severity="flag", message="m")
    ledger.record(*violated(v, w), Flagged(flag="ghost_check_skipped"))
    assert ledger.verdict.violations == [v, w]
    assert ledger.verdict.flags == ["deferred_work", "ghost_check_skipped"]


def test_a_note_amends_the_judged_trial_and_findings_are_kept_in_order(run, ledger):
    t = CorrectnessTrial(trial=1003, kind="timed", passed=False, message="unserved")
    stats = TimingStats(median_ms=1.0, mean_ms=1.0, std_ms=0.0, min_ms=1.0, max_ms=1.0,
                        iqr_ms=0.0, n_trials=1, clock="harness", comparable=False)
    ledger.record(Judged(trial=t), Noted(trial=1003, message="unserved: shape"),
                  Measured(what="eager", stats=stats))
    assert ledger.verdict.trials[0].message == "unserved: shape" and ledger.verdict.eager == stats
    assert [type(f).__name__ for f in ledger.found] == ["Judged", "Noted", "Measured"]


def test_an_error_reaches_the_result_cut_to_the_candidates_frames_without_host_paths(run, ledger):
    """Error text comes from the candidate's process: whatever it read could be in it. What
    is recorded is the type, a few hundred characters of message, the candidate's own frames
    (paths inside the evaluation's dir made relative), and no other absolute path."""
    own = f"{run.root}/cand/candidate.py"
    tb = ('  File "/opt/venv/lib/python3.11/site-packages/torch/nn/modules/module.py", line 1, '
          'in _call_impl\n    return forward_call(*args)\n'
          f'  File "{own}", line 12, in forward\n    names = os.listdir("/root/.config")\n'
          "RuntimeError: found /root/.config/kloop-planted-name\n")
    ledger.record(Decided(status="runtime_error", stage="load", error=ErrorInfo(
        type="RuntimeError", message="found /root/.config/kloop-planted-name " + "x" * 5000,
        traceback=tb, stderr_tail="reading /home/alice/notes.txt\n" * 500)))
    e = ledger.verdict.error
    assert e.type == "RuntimeError"
    assert e.message.startswith("found <path> xxx") and len(e.message) <= 400
    assert 'File "cand/candidate.py", line 12, in forward' in e.traceback
    assert "module.py" not in e.traceback and "forward_call" not in e.traceback
    assert e.traceback.endswith("RuntimeError: found <path>")
    assert len(e.stderr_tail) <= 800 and "reading <path>" in e.stderr_tail
    text = e.model_dump_json()
    assert not any(s in text for s in ("kloop-planted-name", "alice", "/root", "/opt/venv",
                                       str(run.root)))


def test_the_run_keeps_no_verdict_and_a_write_to_one_changes_nothing(run, ledger):
    """The run holds resources only; the verdict is the fold of the findings, made afresh on
    each read: a stage that wrote to it directly would have its write dropped, never
    reported."""
    import dataclasses

    from kloop.evaluator.harness.outcome import Verdict

    run_fields = {f.name for f in dataclasses.fields(type(run))}
    assert {f.name for f in dataclasses.fields(Verdict)} & run_fields == set()
    assert not {"findings", "verdict", "record", "stop"} & (run_fields | set(dir(run)))
    ledger.record(Decided(status="incorrect", stage="correctness"))
    v = ledger.verdict
    v.status, v.flags = "correct", ["written"]
    assert (ledger.verdict.status, ledger.verdict.flags) == ("incorrect", [])
    result = result_of(run, ledger.verdict)
    assert result.status == "incorrect" and result.flags == []


def test_text_from_the_candidates_process_reaches_the_result_cut_and_without_host_paths(run, ledger):
    """Flags, probe violations, a trial's message, compiler output and profiled kernel names
    are text the candidate's process or its compiler shapes: each enters the verdict with host
    paths replaced and cut to a bound, as errors do."""
    from kloop.evaluator.common.result import (
        CompileDiagnostic,
        CompileLog,
        ProfileKernel,
        ProfileSummary,
    )
    from kloop.evaluator.harness.errortext import FLAG_CHARS, MESSAGE_CHARS, NAME_CHARS
    from kloop.evaluator.harness.outcome import Built, Profiled

    secret = "/home/alice/.ssh/id_rsa"
    own = f"{run.root}/cand/candidate.py"
    ledger.record(
        Flagged(flag=f"probe_detail: read {secret} " + "x" * 5000),
        *violated(Violation(rule="deferred_work", severity="reject", message=f"saw {secret}")),
        Judged(trial=CorrectnessTrial(trial=7, kind="timed", passed=False,
                                      message=f"unserved: {secret} at {own}")),
        Built(log=CompileLog(backend="cuda", ok=False, diagnostics=[CompileDiagnostic(
            file="candidate.py", line=3, message=f'cannot open "{secret}"')],
            log_tail=f"{own}(3): error: cannot open {secret}\n", log_path="/var/log/x.log")),
        Profiled(summary=ProfileSummary(activity="cuda", total_ms=1.0, custom_share=1.0,
                                        kernels=[ProfileKernel(name="k" * 1000, kind="custom",
                                                               time_ms=1.0, share=1.0, calls=1)],
                                        text=f"k at {secret}")),
        Decided(status="compile_error", stage="compile"))
    v = ledger.verdict
    assert len(v.flags[0]) <= FLAG_CHARS and "<path>" in v.flags[0]
    assert v.violations[0].message == "saw <path>" and "deferred_work" in v.flags
    assert v.trials[0].message == "unserved: <path> at cand/candidate.py"
    assert len(v.trials[0].message) <= MESSAGE_CHARS
    assert v.compile.diagnostics[0].message == 'cannot open "<path>"'
    assert v.compile.log_tail == "cand/candidate.py(3): error: cannot open <path>\n"
    assert v.compile.log_path == "/var/log/x.log"  # the full log stays for the user
    assert len(v.profile.kernels[0].name) <= NAME_CHARS and v.profile.text == "k at <path>"
    assert "alice" not in result_of(run, ledger.verdict).model_dump_json()


def test_a_stage_returns_its_findings_and_cannot_touch_an_earlier_stages(tmp_path):
    """Each stage gets the findings before it and returns its own; the pipeline keeps the list
    in order and the result is its fold. A stage that decides a status ends the run."""
    from kloop.evaluator.harness.outcome import Built, Clocked, Detected
    from kloop.evaluator.harness.pipeline import STAGES, finish, run_stages
    from kloop.evaluator.harness.stages import static_stage

    good = "import torch\nclass ModelNew(torch.nn.Module):\n    pass\n"
    run = EvalRun.create(get_problem("L3/1"), good, cpu_config(tmp_path / "cache"))
    try:
        earlier = (Flagged(flag="from_an_earlier_stage"),)
        found = static_stage(run, earlier)
        assert earlier == (Flagged(flag="from_an_earlier_stage"),)
        assert {type(f) for f in found} >= {Detected, Clocked} and earlier[0] not in found
        assert Ledger(run.root, earlier + tuple(found)).verdict.backend == "torch"
    finally:
        run.cleanup()

    run = EvalRun.create(get_problem("L3/1"), "def broken(:\n", cpu_config(tmp_path / "c2"))
    findings: list = []
    run_stages(run, STAGES, findings)
    # The static stage decided: no later stage ran (none entered `compile`).
    assert [type(f) for f in findings] == [Built, Decided, Clocked]
    assert [f.name for f in findings if isinstance(f, Clocked)] == ["static"]
    result = finish(run, findings)
    assert (result.status, result.stage_reached) == ("compile_error", "static")
    assert "problem_" not in "".join(f.flag for f in findings if isinstance(f, Flagged))

