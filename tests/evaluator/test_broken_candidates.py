"""Broken candidates get the right status with useful detail (CPU, one batch run in parallel).

Every candidate here targets L3/1 (1_MLP) at a reduced size. The batch runs once per module
through `evaluate_many`; each test then checks one result.
"""

from __future__ import annotations

import pytest
from eval_helpers import candidate, cpu_config
from kloop.evaluator.harness.pipeline import evaluate, evaluate_many

BROKEN = [
    "syntax_error.py", "no_modelnew.py", "off_by_little.py", "wrong_shape.py",
    "wrong_tile_triton.py", "raises.py", "exits.py", "segfault.py", "hangs.py",
    "memory_bomb.py", "mutates_input.py", "subclass_output.py", "env_spy.py",
]
SECRETS = {
    "OPENAI_API_KEY": "sk-must-not-leak", "ANTHROPIC_API_KEY": "sk-ant-must-not-leak",
    "HF_TOKEN": "hf_must_not_leak", "AWS_SECRET_ACCESS_KEY": "must-not-leak",
    "TRITON_AUTH_TOKEN": "allowed-prefix-but-a-secret",
}


@pytest.fixture(scope="module")
def results(cache_dir):
    with pytest.MonkeyPatch.context() as mp:
        for name, value in SECRETS.items():
            mp.setenv(name, value)
        out = evaluate_many([("L3/1", candidate(n)) for n in BROKEN], cpu_config(cache_dir),
                            max_workers=2)
    return dict(zip(BROKEN, out, strict=True))


def test_python_syntax_error_is_a_compile_error_with_its_line(results):
    r = results["syntax_error.py"]
    assert (r.status, r.stage_reached) == ("compile_error", "static")
    assert "line 8" in r.error.message
    assert r.compile is not None and r.compile.diagnostics[0].line == 8
    assert r.correctness == [] and r.timing is None


def test_missing_modelnew_is_a_compile_error(results):
    r = results["no_modelnew.py"]
    # Found by the static pre-check, before any process starts.
    assert (r.status, r.stage_reached) == ("compile_error", "static")
    assert r.error.type == "no_model_new"


@pytest.mark.parametrize(("policy", "precision", "tolerance"), [
    ("strict", "fp32", 1e-4), ("kernelbench", "fp32", 1e-4), ("strict", "bf16", 1e-2),
    ("kernelbench", "fp16", 1e-2)])
def test_every_result_records_the_tolerance_it_was_judged_with(tmp_path, policy, precision, tolerance):
    # Stopped by the static pre-check, before any process starts: the record still says what
    # its outputs would have been held to (the feedback states it).
    r = evaluate("L3/1", candidate("no_modelnew.py"),
                 cpu_config(tmp_path, policy=policy, precision=precision))
    assert (r.status, r.policy, r.tolerance) == ("compile_error", policy, tolerance)


def test_output_just_outside_tolerance_is_incorrect_with_its_error(results):
    r = results["off_by_little.py"]
    assert (r.status, r.stage_reached) == ("incorrect", "correctness")
    assert [t.kind for t in r.correctness] == ["random"] * 5 + ["reparam"]
    assert not any(t.passed for t in r.correctness)
    diff = r.correctness[0].outputs[0]
    assert 2.5e-4 < diff.max_abs_err < 3.5e-4
    assert diff.mismatch_fraction == 1.0
    assert r.tolerance == 1e-4
    assert len(diff.worst) == 5
    assert r.timing is None  # an incorrect candidate is never timed


def test_wrong_shape_is_reported_as_a_shape_mismatch(results):
    r = results["wrong_shape.py"]
    assert r.status == "incorrect"
    diff = r.correctness[0].outputs[0]
    assert (diff.expected_shape, diff.got_shape) == ([2, 128], [2, 127])
    assert "shape" in diff.message


def test_wrong_tile_is_located(results):
    r = results["wrong_tile_triton.py"]
    assert r.status == "incorrect"
    diff = r.correctness[0].outputs[0]
    assert diff.mismatch_fraction == pytest.approx(0.5)
    assert all(64 <= w.index[1] < 128 for w in diff.worst)
    assert all(w.got - w.expected == pytest.approx(0.5, abs=1e-4) for w in diff.worst)
    assert "cpu_emulation" in r.flags


def test_exception_in_forward_is_a_runtime_error_with_candidate_frames(results):
    r = results["raises.py"]
    assert (r.status, r.stage_reached) == ("runtime_error", "correctness")
    assert r.error.type == "ValueError" and r.error.message == "candidate gave up"
    assert "candidate.py" in r.error.traceback


def test_os_exit_is_a_runtime_error_with_its_exit_code(results):
    r = results["exits.py"]
    assert r.status == "runtime_error"
    assert r.error.type == "ProcessExit" and "code 3" in r.error.message


def test_segfault_is_a_runtime_error_with_its_signal(results):
    r = results["segfault.py"]
    assert r.status == "runtime_error"
    assert r.error.type == "SIGSEGV"
    assert r.stage_reached == "correctness"


def test_infinite_loop_times_out_in_its_stage(results):
    r = results["hangs.py"]
    assert (r.status, r.stage_reached) == ("timeout", "correctness")
    assert "15 s" in r.error.message


def test_memory_bomb_is_a_runtime_error_not_a_dead_harness(results):
    r = results["memory_bomb.py"]
    assert r.status == "runtime_error"
    assert "memory" in (r.error.message + r.error.type).lower()


def test_input_mutation_is_rejected_under_strict(results):
    r = results["mutates_input.py"]
    assert r.status == "rejected"
    assert [v.rule for v in r.violations] == ["input_mutation"]
    assert r.violations[0].severity == "reject"
    assert "input_mutation" in r.flags
    assert all(t.passed for t in r.correctness)  # its outputs were right


def test_tensor_subclass_output_is_rejected_before_it_runs(results):
    # The runtime side (only plain torch.Tensor outputs are accepted) is exercised under the
    # kernelbench policy by tests/exploits (C12).
    r = results["subclass_output.py"]
    assert (r.status, r.stage_reached) == ("rejected", "static")
    assert {v.rule for v in r.violations} == {"tensor_subclass"}


def test_candidate_sees_no_secrets_and_not_the_real_home(results):
    r = results["env_spy.py"]
    assert r.status == "correct", r.error
