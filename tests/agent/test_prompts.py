"""Every template renders with fixture data for every outcome; missing variables fail loudly."""

from __future__ import annotations

import jinja2
import pytest
from agent_fakes import FakeEvaluator, kernel, timing, with_interval
from kloop.agent.budget import Spend
from kloop.agent.config import AgentConfig
from kloop.agent.episode import EpisodeSpec, EpisodeState, feedback_template, feedback_vars
from kloop.agent.models.base import ModelReply, Usage
from kloop.agent.prompts import PACKAGED_DIR, PromptSet, clip
from kloop.agent.records import ModelFaultInfo, TurnRecord
from kloop.evaluator.common.config import POLICIES, EvalConfig
from kloop.evaluator.common.result import ErrorInfo, OutputDiff, Violation
from kloop.problems.registry import get_problem

MARKERS = {"compile_error": "SYNTAX", "runtime_error": "CRASH", "timeout": "HANG", "incorrect": "BUG",
           "rejected": "CHEAT", "not_run": "CUDA_ONLY", "correct": ""}
PROBLEM = get_problem("L3/4")
STRICT_FP32 = EvalConfig().comparison()


def turn_with(result=None, fault=None) -> TurnRecord:
    r = ModelReply(text="t", usage=Usage(), cost_usd=0.0, finish_reason="stop", latency_s=0.0,
                   model="m", raw={})
    return TurnRecord(run_id="r", episode_key="k", episode=0, problem_id=PROBLEM.id,
                      problem_stem=PROBLEM.stem, turn=1, messages=[], reply=r, fault=fault,
                      code="x" if result else None, code_sha256="h" if result else None,
                      kernel_path="kernels/x/0-1.py" if result else None, eval=result, feedback="",
                      spend=Spend(), started_at="t", finished_at="t")


def render_feedback(rec: TurnRecord, agent: AgentConfig | None = None) -> str:
    agent = agent or AgentConfig()
    state = EpisodeState(EpisodeSpec(problem=PROBLEM, key="k", episode=0, sample=0, max_turns=4))
    return PromptSet().render(feedback_template(rec.eval), **feedback_vars(state, rec.eval, rec.fault, agent))


# For each outcome, the verdict in the first line and what the model needs from that result
# record (the fake evaluator's records, see agent_fakes) to act on it.
SHOWN = {
    "compile_error": ("compile error", ["did not compile (triton, sm_90)",
                                        "candidate.py:2:5: error: invalid syntax (x2)",
                                        "Fix the errors."]),
    "runtime_error": ("runtime error", ["failed while running forward",
                                        "RuntimeError: index out of range in kernel",
                                        'File "candidate.py", line 7, in forward']),
    "timeout": ("timeout", ["ran past the time limit at stage `correctness`",
                            "Timeout: correctness stage ran past 300 s"]),
    "incorrect": ("wrong result", ["does not match the reference in 5 of 5 checks",
                                   "max abs error 0.5, max rel error 2, 12.5% of elements",
                                   "worst elements: [3, 7] expected 0.25 got 0.75",
                                   "Other failing checks:", "Find the bug."]),
    "rejected": ("rejected", ["refused by the evaluator's rules (policy `strict`)",
                              "rule `output_cache` (line 3): caches outputs across calls"]),
    "not_run": ("compiled, not run", ["passed the compile check (sm_90 (compile check only))",
                                      "could not be run on this machine (cuda:0)"]),
    "correct": ("correct", ["matches the reference in all 5 checks",
                            "Median runtime 1 ms over 10 runs; PyTorch eager 2 ms (speedup 2.00x).",
                            "Make it faster while keeping it correct."]),
}


@pytest.mark.parametrize("status", sorted(MARKERS))
def test_feedback_renders_what_each_outcome_needs(status):
    verdict, details = SHOWN[status]
    text = render_feedback(turn_with(FakeEvaluator().evaluate(PROBLEM, kernel(MARKERS[status]))))
    assert text.startswith(f"Turn 1 of 4: {verdict}.\n"), text
    for detail in details:
        assert detail in text, (detail, text)
    assert "3 turns left" in text
    # No other outcome's verdict line or details leak into this one's feedback.
    for other, (_, other_details) in SHOWN.items():
        if other != status:
            assert not any(d in text for d in other_details if d not in details), (other, text)


def test_feedback_uses_every_optional_field():
    ev = FakeEvaluator(comparable=False)
    result = ev.evaluate(PROBLEM, kernel()).model_copy(update={
        "compiled": timing(1.5, False), "speedup_vs_compile": 1.5, "flags": ["excessive_speedup"],
        "has_custom_kernel": False})
    text = render_feedback(turn_with(result))
    assert "torch.compile 1.5 ms (speedup 1.50x)" in text and "not comparable" in text
    assert "no custom kernel" in text and "excessive_speedup" in text and "fused_kernel" in text
    assert "fused_kernel" not in render_feedback(turn_with(result), AgentConfig(profile_feedback=False))

    bad = ev.evaluate(PROBLEM, kernel("BUG"))
    diff = OutputDiff(ok=False, expected_shape=[2, 3], got_shape=[3, 2], expected_dtype="torch.float32",
                      got_dtype="torch.float16", got_type="MyTensor", nan_got=4, inf_got=1,
                      message="shape differs")
    bad.correctness[0].outputs = [diff]
    bad.correctness[0].message = "first check"
    second = bad.correctness[1].outputs[0].model_copy(update={"message": "3 of 8 outside"})
    bad.correctness[1].outputs, bad.correctness[1].message = [second], "3 of 8 outside"
    text = render_feedback(turn_with(bad))
    assert text.count("3 of 8 outside") == 1
    assert "shape [3, 2], expected [2, 3]" in text and "dtype torch.float16" in text
    assert "returned a MyTensor" in text and "4 NaN and 1 Inf" in text and "first check" in text

    crash = ev.evaluate(PROBLEM, kernel("CRASH"))
    crash.error = ErrorInfo(type="RuntimeError", message="m" * 10000, traceback="tb", stderr_tail="segv")
    text = render_feedback(turn_with(crash))
    assert "characters cut" in text and "segv" in text and len(text) < 8000

    cheat = ev.evaluate(PROBLEM, kernel("CHEAT"))
    cheat.violations.append(Violation(rule="timing_patch", severity="flag", message="looks odd"))
    text = render_feedback(turn_with(cheat))
    assert "rule `output_cache` (line 3)" in text and "note `timing_patch`" in text


def test_feedback_shows_the_reduce_overhead_baseline_and_the_fastest():
    result = FakeEvaluator().evaluate(PROBLEM, kernel(runtime_ms=0.5)).model_copy(update={
        "compiled": timing(1.0), "speedup_vs_compile": 2.0, "compiled_ro": timing(0.625),
        "speedup_vs_compile_ro": 1.25, "speedup_vs_best": 1.25, "best_baseline": "compile_ro"})
    text = render_feedback(turn_with(result))
    assert ("PyTorch eager 2 ms (speedup 4.00x); torch.compile 1 ms (speedup 2.00x); torch.compile "
            "reduce-overhead 0.625 ms (speedup 1.25x); fastest baseline: torch.compile reduce-overhead "
            "(speedup 1.25x).") in text
    # A failed reduce-overhead baseline is left out; the fastest is then among the others.
    failed = result.model_copy(update={"compiled_ro": None, "speedup_vs_compile_ro": None,
                                       "speedup_vs_best": 2.0, "best_baseline": "compile"})
    text = render_feedback(turn_with(failed))
    assert "reduce-overhead" not in text and "fastest baseline: torch.compile (speedup 2.00x)." in text
    # With eager alone there is nothing to choose from: no line on the fastest.
    alone = FakeEvaluator().evaluate(PROBLEM, kernel(runtime_ms=0.5))
    assert alone.best_baseline == "eager"
    assert "fastest baseline" not in render_feedback(turn_with(alone))


def test_gpu_feedback_states_the_share_of_speed_of_light():
    from kloop.agent.report.bound import PEAKS, sol_ms
    from kloop.evaluator.common.result import EnvInfo
    from kloop.problems.cost import cost_of

    h200 = EnvInfo(python="3.12", torch="2.9", device_name="NVIDIA H200")
    result = FakeEvaluator().evaluate(PROBLEM, kernel(runtime_ms=0.5)).model_copy(update={"env": h200})
    sol = sol_ms(cost_of(PROBLEM), PEAKS["NVIDIA H200"], "fp32")
    text = render_feedback(turn_with(result))
    assert f"That is {100 * sol / 0.5:.1f} % of the NVIDIA H200's speed of light" in text
    # No bound where none is known: a host clock, a GPU not in the table, shrunk sizes.
    for update in ({"device": "cpu", "env": None}, {"env": h200.model_copy(update={"device_name": "X"})},
                   {"env": h200, "problem_overrides": {"batch_size": 2}}):
        assert "speed of light" not in render_feedback(turn_with(result.model_copy(update=update)))


def test_feedback_gives_each_speedup_its_interval_over_the_paired_rounds():
    result = FakeEvaluator().evaluate(PROBLEM, kernel(runtime_ms=1.6260163)).model_copy(update={
        "compiled": timing(1.0), "speedup_vs_compile": 0.615, "speedup_vs_best": 0.615,
        "best_baseline": "compile"})
    result = with_interval(with_interval(result, 1.18, 1.29), 0.6, 0.63, baseline="compile")
    text = render_feedback(turn_with(result))
    assert "PyTorch eager 2 ms (speedup 1.23x, 95 % interval 1.18-1.29 over 10 rounds)" in text
    assert "torch.compile 1 ms (speedup 0.61x, 95 % interval 0.60-0.63 over 10 rounds)" in text
    assert "fastest baseline: torch.compile (speedup 0.61x, 95 % interval 0.60-0.63 over 10 rounds)" in text
    # Without an interval (no paired rounds, or an older record) the point estimate alone.
    plain = render_feedback(turn_with(FakeEvaluator().evaluate(PROBLEM, kernel(runtime_ms=0.5))))
    assert "(speedup 4.00x)" in plain and "interval" not in plain
    # The tool-using agent's results say the same.
    profiled = PromptSet().render("tool_profile", result=result.model_copy(update={"profile": None}),
                                  judged_at=None)
    assert "(1.23x vs PyTorch eager, 95 % interval 1.18-1.29 over 10 rounds)" in profiled


def test_feedback_says_when_the_model_runs_below_the_clocks_resolution():
    result = FakeEvaluator().evaluate(PROBLEM, kernel(runtime_ms=0.5))
    assert "resolution" not in render_feedback(turn_with(result))
    flagged = result.model_copy(update={"flags": [
        "below_clock_resolution: a median under 5x the handshake (0.012 ms)"]})
    text = render_feedback(turn_with(flagged))
    assert ("This model runs below the clock's resolution: each call's serving overhead is a large "
            "share of its measured time, so this speedup is dominated by that overhead") in text
    assert "Make each launch do more work or fuse more of the model into fewer kernels." in text


def test_format_error_feedback():
    text = render_feedback(turn_with(fault=ModelFaultInfo(type="NoKernelFound", message="no block")))
    assert "could not be evaluated: no block" in text


@pytest.mark.parametrize("backend", ["cuda", "triton"])
@pytest.mark.parametrize("gpu", ["h200", None])
def test_task_and_system_prompts_render_for_each_backend(backend, gpu):
    prompts = PromptSet()
    variables = dict(problem=PROBLEM, backend=backend, gpu=gpu, max_turns=4, comparison=STRICT_FP32,
                     sizes={})
    task = prompts.render("task", **variables)
    system = prompts.render("system", **variables)
    assert PROBLEM.source.strip() in task and "ModelNew" in task and "secret seed" in task
    assert ("load_inline" in task) == (backend == "cuda")
    assert ("@triton.jit" in task) == (backend == "triton")
    assert ("132 SMs" in task) == (gpu == "h200")
    assert ("CUDA C++" in system) == (backend == "cuda")


# What each (policy, precision) allows, written out rather than read from the policy table, so a
# changed tolerance shows up here as well as in the prompts.
SHOWN_TOLERANCE = {("strict", "fp32"): "0.0001", ("kernelbench", "fp32"): "0.0001",
                   ("strict", "bf16"): "0.01", ("kernelbench", "bf16"): "0.01",
                   ("strict", "fp16"): "0.01", ("kernelbench", "fp16"): "0.01"}


@pytest.mark.parametrize(("policy", "precision"), sorted(SHOWN_TOLERANCE))
def test_prompts_state_the_tolerance_of_the_policy_and_precision(policy, precision):
    assert set(POLICIES) == {p for p, _ in SHOWN_TOLERANCE}
    shown = SHOWN_TOLERANCE[policy, precision]
    comparison = EvalConfig(policy=policy, precision=precision).comparison()
    task = PromptSet().render("task", problem=PROBLEM, backend="triton", gpu=None, max_turns=4,
                              comparison=comparison, sizes={})
    assert f"Models and inputs are in {precision}." in task
    assert f"`atol = rtol = {shown}`" in task and f"(policy `{policy}`)" in task

    # The feedback shows the tolerance the result itself was judged with.
    bad = FakeEvaluator().evaluate(PROBLEM, kernel("BUG"))
    bad = bad.model_copy(update={"policy": policy, "tolerance": comparison.tolerance})
    text = render_feedback(turn_with(bad))
    assert f"(policy `{policy}`: every element must satisfy |yours - ref| <= {shown} + {shown} * |ref|)" in text
    assert "1e-4" not in task + text  # the hard-coded number of old


def test_the_rules_say_how_the_active_policy_builds_and_times():
    def rules(policy: str) -> str:
        return PromptSet().render("task", problem=PROBLEM, backend="triton", gpu=None, max_turns=4,
                                  comparison=EvalConfig(policy=policy).comparison(), sizes={})

    strict, kernelbench = rules("strict"), rules("kernelbench")
    assert "secret seed" in strict and "made noisy" in strict and "manual_seed(42)" not in strict
    assert "own wall clock around each call" in strict and "CUDA events (" not in strict
    assert "compare the median" in strict
    assert "manual_seed(42)" in kernelbench and "secret seed" not in kernelbench
    assert "measured with CUDA events" in kernelbench and "compare the mean" in kernelbench


def test_incorrect_feedback_without_a_recorded_tolerance_states_no_number():
    bad = FakeEvaluator().evaluate(PROBLEM, kernel("BUG"))
    assert bad.tolerance is None  # a record from before results kept their tolerance
    text = render_feedback(turn_with(bad))
    assert "checks (policy `strict`).\n" in text and "|ref|" not in text


def test_every_packaged_template_is_covered():
    names = set(PromptSet().names())
    covered = {"system.j2", "task.j2", "feedback_format_error.j2"} | {f"feedback_{s}.j2" for s in MARKERS}
    # The condensing context policies' templates render in tests/agent/test_context.py.
    covered |= {"context_digest.j2", "context_summary.j2", "summarize.j2"}
    # The tool-using agent's, in tests/agent/test_agentic.py.
    covered |= {"agent_system.j2", "tool_problem.j2", "tool_profile.j2", "tool_submitted.j2",
                "tool_error.j2"}
    assert names == covered


def test_a_missing_variable_is_an_error_not_an_empty_string():
    with pytest.raises(jinja2.UndefinedError, match="max_turns"):
        PromptSet().render("task", problem=PROBLEM, backend="triton", gpu="h200", comparison=STRICT_FP32,
                           sizes={})


def test_a_user_prompts_dir_overrides_single_templates(tmp_path):
    (tmp_path / "system.j2").write_text("Custom system for {{ backend }}.\n")
    prompts = PromptSet(tmp_path)
    assert prompts.render("system", backend="cuda") == "Custom system for cuda.\n"
    assert "@triton.jit" in prompts.render("task", problem=PROBLEM, backend="triton", gpu=None, max_turns=1,
                                          comparison=STRICT_FP32, sizes={})
    assert (PACKAGED_DIR / "system.j2").exists()


def test_clip_keeps_head_and_tail():
    text = "HEAD" + "x" * 5000 + "TAIL"
    out = clip(text, 300)
    assert out.startswith("HEAD") and out.endswith("TAIL") and len(out) < 400


def test_feedback_says_why_a_cuda_build_took_the_slow_path():
    """The model learns why its `.cu` could not build lean (and how long it took), on every
    outcome after a build but a compile error (where the error comes first)."""
    from kloop.evaluator.common.result import CompileLog

    why = "it names `torch`, which is torch's"
    slow = CompileLog(backend="cuda", ok=True, seconds=41.2,
                      nvcc_runs=[f"lean refused: {why}", "split"])
    lean = CompileLog(backend="cuda", ok=True, seconds=9.8, nvcc_runs=["lean"])
    for marker in ("", "BUG", "CRASH"):
        result = FakeEvaluator().evaluate(PROBLEM, kernel(marker))
        text = render_feedback(turn_with(result.model_copy(update={"compile": slow})))
        assert f"slow build path because {why} (built in 41 s)" in text, text
        assert "slow build path" not in render_feedback(
            turn_with(result.model_copy(update={"compile": lean})))
    broken = FakeEvaluator().evaluate(PROBLEM, kernel("SYNTAX"))
    assert "slow build path" not in render_feedback(turn_with(broken.model_copy(update={
        "compile": broken.compile.model_copy(update={"nvcc_runs": slow.nvcc_runs})})))
    # The reason comes from the compile child, the candidate's own process: it is cut short.
    flood = slow.model_copy(update={"nvcc_runs": ["lean refused: " + "x" * 100_000]})
    ok = FakeEvaluator().evaluate(PROBLEM, kernel())
    assert len(render_feedback(turn_with(ok.model_copy(update={"compile": flood})))) < 5000
