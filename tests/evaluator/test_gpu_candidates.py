"""GPU suite (run on the H200): honest CUDA and Triton candidates, crashes and hangs on a real
device, and the consistency of the timing itself.

Run with `pytest tests/evaluator/test_gpu_candidates.py -m gpu -v` on the GPU machine.
"""

from __future__ import annotations

import pytest
from eval_helpers import MLP_SMALL, candidate

from kloop.evaluator.common.config import POLICIES, EvalConfig, StageTimeouts
from kloop.evaluator.harness import budget
from kloop.evaluator.harness.paired import first_half
from kloop.evaluator.harness.pipeline import evaluate, evaluate_many

pytestmark = pytest.mark.gpu

# Sizes between the CI ones and the full problems: seconds per evaluation, not minutes.
MLP_MEDIUM = {"batch_size": 64, "input_size": 4096, "layer_sizes": [4096, 4096],
              "output_size": 2048}


def gpu_config(cache_dir, **overrides) -> EvalConfig:
    fields = dict(device="cuda", cache_dir=cache_dir, baselines="eager")
    fields.update(overrides)
    return EvalConfig(**fields)


def _timing_pair(r) -> str:
    """The figures that say why a same-code ratio is off (pytest cuts a long repr)."""
    def one(t):
        return (f"median {t.median_ms:.4f} min {t.min_ms:.4f} mean {t.mean_ms:.4f} "
                f"std {t.std_ms:.4f} raw {t.raw_median_ms} events {t.worker_event_median_ms} "
                f"handshake {t.handshake_ms}") if t else "none"
    return f"candidate: {one(r.timing)}; eager: {one(r.eager)}"


def _assert_correct_and_timed(r):
    assert r.status == "correct", (r.error, r.compile, [t.message for t in r.correctness])
    assert r.stage_reached == "done"
    t = r.timing
    assert t is not None and t.clock == "harness" and t.comparable
    # 100 calls a side, or as many as the budget gave a slow model (`harness.budget`); half of
    # them where the sequential rule stopped the rounds (`Policy.timing_stop_width`).
    plan = r.paired.plan
    made = first_half(plan.calls) if r.paired.stopped_early else plan.calls
    assert t.n_trials == made and plan.full == 100, (plan, r.paired)
    assert plan.calls == budget.calls_for(100, POLICIES[r.policy], plan.eager_ms), plan
    assert t.handshake_ms is not None and 0 < t.handshake_ms < 5.0, t
    assert t.worker_event_median_ms is not None
    assert r.eager is not None and r.speedup_vs_eager is not None
    assert r.env is not None and r.env.gpu_arch and r.env.device_name
    assert "cpu_emulation" not in r.flags


def test_fused_triton_linear_relu_for_mlp(cache_dir):
    r = evaluate("L3/1", candidate("mlp_triton.py"), gpu_config(cache_dir, baselines="both"))
    _assert_correct_and_timed(r)
    assert r.backend == "triton" and r.compiled is not None and r.speedup_vs_compile is not None
    assert r.profile is not None and r.profile.activity == "cuda"
    assert r.profile.custom_share is not None and r.profile.custom_share > 0.5
    assert any(k.kind == "custom" and "linear_kernel" in k.name for k in r.profile.kernels)


@pytest.mark.alone  # how many calls fall outside the interval: contention moves the handshake
def test_kernelbench_divides_bounded_events_on_the_gpu(cache_dir):
    """Under `kernelbench` the speedup divides the workers' CUDA events, each kept within the
    trusted clock's interval; strict's numbers (wall less the fastest null call) stay beside."""
    r = evaluate("L3/1", candidate("mlp_torch.py"),
                 gpu_config(cache_dir, policy="kernelbench", problem_overrides=MLP_MEDIUM))
    assert r.status == "correct", r.error
    assert r.speedup_clock == "events_bounded"
    for t in (r.timing, r.eager):
        ev = t.events
        assert ev is not None and ev.bound_ms >= (t.handshake_ms or 0.0)
        assert ev.min_ms >= t.min_ms + (t.handshake_ms or 0) - ev.bound_ms - 1e-9
        # Events leave the serving out: below the trusted clock's numbers, which keep it in.
        assert ev.mean_ms <= t.mean_ms
        # Each call's event kept within [wall - bound, wall - handshake]; strict's figure is
        # wall - handshake, so the mean lies within the bound less the handshake below it.
        assert ev.mean_ms >= t.mean_ms + (t.handshake_ms or 0) - ev.bound_ms - 1e-9
    # The bound comes from the reference worker's own calls, so few of them fall outside it.
    # A candidate child's calls cost more outside their events (why is not measured): on the H200
    # 95 of its 100 calls were raised (2026-12-03 at e20ddab), a bias against the candidate,
    # never for it.
    assert r.eager.events.raised + r.eager.events.lowered < r.eager.n_trials // 2, r.eager.events
    assert r.speedup_vs_eager == pytest.approx(r.eager.events.mean_ms / r.timing.events.mean_ms)


def test_cuda_candidates_build_in_parallel_and_are_correct(cache_dir):
    items = [
        ("L3/43", candidate("attention_cuda.py")),
        ("L3/8", candidate("resnet_block_bn_relu_cuda.py")),
        ("L3/1", candidate("mlp_cuda_relu.py")),
    ]
    results = evaluate_many(items, gpu_config(cache_dir, problem_overrides={}), max_workers=3)
    for r in results[:2]:
        _assert_correct_and_timed(r)
        assert r.backend == "cuda" and r.compile is not None and r.compile.ok
        assert r.profile is not None and r.profile.custom_share and r.profile.custom_share > 0
    # 1_MLP at full size: the CUDA ReLU is a tiny part, but it must be correct.
    assert results[2].status == "correct", results[2].error
    # A second evaluation of the same source reuses the built extension.
    again = evaluate("L3/1", candidate("mlp_cuda_relu.py"),
                     gpu_config(cache_dir, problem_overrides=MLP_MEDIUM))
    assert again.status == "correct" and again.compile is not None and again.compile.cache_hit


def test_illegal_address_is_a_runtime_error_and_the_next_candidate_runs(cache_dir):
    config = gpu_config(cache_dir, problem_overrides=MLP_SMALL, baselines="none")
    bad = evaluate("L3/1", candidate("illegal_address_cuda.py"), config)
    assert (bad.status, bad.stage_reached) == ("runtime_error", "correctness")
    assert "illegal memory access" in (bad.error.message + (bad.error.stderr_tail or ""))
    good = evaluate("L3/1", candidate("mlp_cuda_relu.py"), config)
    assert good.status == "correct", good.error


def test_hanging_kernel_times_out_and_the_gpu_stays_usable(cache_dir):
    timeouts = StageTimeouts(correctness=20)
    config = gpu_config(cache_dir, problem_overrides=MLP_SMALL, baselines="none",
                        timeouts=timeouts)
    r = evaluate("L3/1", candidate("hang_cuda.py"), config)
    assert (r.status, r.stage_reached) == ("timeout", "correctness")
    good = evaluate("L3/1", candidate("mlp_torch.py"), config)
    assert good.status == "correct", good.error


@pytest.mark.alone  # a ratio of times: other tests' GPU work would skew it
def test_same_model_timed_in_two_processes_agrees(cache_dir):
    """A plain-PyTorch copy of the reference, timed in the candidate process, against the eager
    baseline timed in the reference worker: the same function, so a ratio near 1."""
    r = evaluate("L3/1", candidate("mlp_torch.py"),
                 gpu_config(cache_dir, problem_overrides=MLP_MEDIUM))
    _assert_correct_and_timed(r)
    assert r.has_custom_kernel is False
    assert 0.8 < r.speedup_vs_eager < 1.25, _timing_pair(r)


@pytest.mark.alone  # a ratio of times: other tests' GPU work would skew it
def test_the_harness_clock_agrees_with_cuda_events_for_a_millisecond_model(cache_dir):
    """An honest model of a few milliseconds: the harness's clock net of its handshake and the
    worker's own CUDA events time the same forward within 3 % (bench/clock.py has the table;
    it failed until the harness judged outputs on one CPU thread, evaluator.harness.cputhreads)."""
    big = {"batch_size": 4096, "input_size": 4096, "layer_sizes": [4096, 4096],
           "output_size": 4096}
    r = evaluate("L3/1", candidate("mlp_torch.py"),
                 gpu_config(cache_dir, problem_overrides=big, baselines="none"))
    assert r.status == "correct", r.error
    t = r.timing
    assert t is not None and t.worker_event_median_ms is not None and t.median_ms > 1.0, t
    assert abs(t.median_ms / t.worker_event_median_ms - 1) < 0.03, t


def test_broken_outputs_on_gpu(cache_dir):
    names = ["off_by_little.py", "wrong_shape.py", "raises.py", "mutates_input.py"]
    results = evaluate_many([("L3/1", candidate(n)) for n in names],
                            gpu_config(cache_dir, problem_overrides=MLP_SMALL, baselines="none"))
    assert [r.status for r in results] == ["incorrect", "incorrect", "runtime_error", "rejected"]


def test_kernelbench_policy_reports_mean_based_speedup(cache_dir):
    r = evaluate("L3/1", candidate("mlp_torch.py"),
                 gpu_config(cache_dir, policy="kernelbench", problem_overrides=MLP_MEDIUM))
    _assert_correct_and_timed(r)
    assert r.policy == "kernelbench"
    # The mean of each call's CUDA events, each kept within the trusted clock's interval.
    assert r.speedup_clock == "events_bounded"
    assert r.speedup_vs_eager == pytest.approx(r.eager.events.mean_ms / r.timing.events.mean_ms)


def test_ncu_metrics_for_the_top_custom_kernel(cache_dir):
    r = evaluate("L3/1", candidate("mlp_cuda_relu.py"),
                 gpu_config(cache_dir, problem_overrides=MLP_MEDIUM, ncu=True))
    assert r.status == "correct", r.error
    assert r.profile is not None and r.profile.ncu is not None, r.flags
    assert "relu_kernel" in r.profile.ncu.kernel
    assert r.profile.ncu.duration_us and r.profile.ncu.registers_per_thread


def test_ncu_table_for_a_triton_candidate(cache_dir):
    """`eval.ncu: true` on a Triton MLP: one ncu run (under the sandbox identity, as every ncu
    pass) profiles its kernel with every curated metric, and the feedback's table shows it."""
    from kloop.agent.prompts import PromptSet
    from kloop.evaluator.common.resources import bare_name
    from kloop.evaluator.harness.ncu import METRICS, STALL_REASONS

    r = evaluate("L3/1", candidate("mlp_triton.py"),
                 gpu_config(cache_dir, problem_overrides=MLP_MEDIUM, ncu=True))
    assert r.status == "correct", r.error
    assert r.profile is not None and r.profile.ncu_kernels, r.flags
    k = r.profile.ncu_kernels[0]
    assert bare_name(k.kernel) == "linear_kernel" and r.profile.ncu == k
    missing = [f for f in METRICS.values() if getattr(k, f) is None]
    assert not missing, (missing, k)  # every metric name exists on this GPU and ncu version
    assert k.duration_us > 0 and 0 < k.achieved_occupancy_pct <= 100
    assert 0 < k.theoretical_occupancy_pct <= 100 and k.sm_count > 0
    assert set(k.stalls) == set(STALL_REASONS) and any(v > 0 for v in k.stalls.values()), k
    assert r.stage_seconds.get("ncu", 0) > 0  # its own seconds, inside the evaluation's time
    text = PromptSet().render("_ncu", result=r, profile_feedback=True)
    row = next(line for line in text.splitlines() if line.startswith("| `linear_kernel` |"))
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert float(cells[1]) > 0 and 0 < float(cells[2].split()[0]) <= 100
    top = max(k.stalls, key=k.stalls.__getitem__)
    assert cells[-1].startswith(top), (cells, k.stalls)
    assert "- `linear_kernel`: " in text, text


def test_the_served_draw_seeds_cuda_streams_as_manual_seed_does():
    import torch

    from kloop.evaluator.worker.construct import seed_all

    torch.manual_seed(91)
    want = torch.randn(1000, device="cuda"), torch.randint(0, 7, (50,), device="cuda")
    torch.randn(10_000, device="cuda")
    seed_all(91)
    got = torch.randn(1000, device="cuda"), torch.randint(0, 7, (50,), device="cuda")
    assert all(torch.equal(a, b) for a, b in zip(want, got, strict=True))


@pytest.mark.alone  # a ratio of times: other tests' GPU work would skew it
def test_a_profiled_process_launches_as_fast_afterwards_with_the_childrens_environment(tmp_path):
    """The candidate process runs torch.profiler in its probe trials and is timed after: with
    the children's environment (TEARDOWN_CUPTI=1) a launch-bound forward is as fast after a
    profiler session as before (bench/cupti.py prints the unset and 0 cases beside it)."""
    import importlib.util
    import os
    from pathlib import Path

    from kloop.evaluator.procs.sandbox import child_env

    spec = importlib.util.spec_from_file_location(
        "bench_cupti", Path(__file__).resolve().parents[2] / "bench" / "cupti.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    os.environ["TEARDOWN_CUPTI"] = child_env(tmp_path, "cuda:0")["TEARDOWN_CUPTI"]
    try:
        r = bench.measure(os.environ["TEARDOWN_CUPTI"])
    finally:
        os.environ.pop("TEARDOWN_CUPTI", None)
    assert r["after"] / r["before"] < 1.25, r


def test_a_real_cuda_build_splits_and_its_errors_point_into_the_candidate(tmp_path):
    """Builds on the GPU machine go through the parallel nvcc (evaluator.build.nvcc_parallel)
    inside the evaluator's compile child: an honest extension builds (as two halves) and is
    correct, and an nvcc error comes back at the candidate's own line from the plain build
    that follows a failed half, as the CPU compile check reports it."""
    config = gpu_config(tmp_path / "cache", problem_overrides=MLP_SMALL, baselines="none")
    bad, good = evaluate_many([("L3/1", candidate("cuda_compile_error.py")),
                               ("L3/1", candidate("mlp_cuda_relu.py"))], config, max_workers=2)
    assert (bad.status, bad.stage_reached) == ("compile_error", "compile"), bad.error
    assert any(d.file == "candidate.py" and d.line == 12 and '"zero" is undefined' in d.message
               for d in bad.compile.diagnostics), bad.compile
    # Its device half fails; then the plain build (chains side by side) speaks.
    assert bad.compile.nvcc_runs == ["torch form failed: the device half did not build (built "
                                     "the plain way)", "split"], bad.compile
    assert good.status == "correct", good.error
    assert good.compile is not None and len(good.compile.nvcc_runs) == 1, good.compile
    assert good.compile.nvcc_runs[0].startswith("torch form ("), good.compile


def test_a_torch_free_cu_builds_lean_and_the_rest_the_plain_way(tmp_path):
    """`lean_cuda: on` in the evaluator's compile child: a `.cu` that names nothing of torch is
    built lean (`evaluator.build.lean`) and is correct and timed on the GPU; one that includes
    `<torch/extension.h>` and launches from a torch host function is built as two halves
    (`evaluator.build.torch_form`), is correct, and no plain build followed."""
    config = gpu_config(tmp_path / "cache", problem_overrides=MLP_MEDIUM, lean_cuda="on")
    lean_r, torch_r = evaluate_many([("L3/1", candidate("mlp_cuda_relu_lean.py")),
                                     ("L3/1", candidate("mlp_cuda_relu.py"))], config, max_workers=2)
    _assert_correct_and_timed(lean_r)
    assert lean_r.compile is not None and lean_r.compile.nvcc_runs == ["lean"], lean_r.compile
    _assert_correct_and_timed(torch_r)
    assert torch_r.compile is not None and len(torch_r.compile.nvcc_runs) == 1, torch_r.compile
    assert torch_r.compile.nvcc_runs[0].startswith("torch form ("), torch_r.compile


def test_the_torch_form_candidates_build_as_two_halves_and_are_correct(cache_dir):
    """The repo's `.cu` files that include `<torch/extension.h>` (one kernel a launch; two
    kernels, stats then apply; shared memory): each built as two halves, correct and timed."""
    items = [("L3/43", candidate("attention_cuda.py")),
             ("L3/8", candidate("resnet_block_bn_relu_cuda.py"))]
    for r in evaluate_many(items, gpu_config(cache_dir, problem_overrides={}), max_workers=2):
        _assert_correct_and_timed(r)
        assert r.compile is not None and len(r.compile.nvcc_runs) == 1, r.compile
        assert r.compile.nvcc_runs[0].startswith("torch form ("), r.compile


def test_lean_forms_of_the_attention_and_bn_relu_candidates_build_lean_and_are_correct(
        cache_dir):
    """The default config (`lean_cuda: on`) and two torch-free `.cu` with shared memory,
    shuffles, `FLT_MAX` and several kernels a launcher: built lean, correct, timed, profiled."""
    items = [("L3/43", candidate("attention_cuda_lean.py")),
             ("L3/8", candidate("resnet_block_bn_relu_cuda_lean.py"))]
    config = gpu_config(cache_dir, problem_overrides={})
    assert config.lean_cuda == "on"
    for r in evaluate_many(items, config, max_workers=2):
        _assert_correct_and_timed(r)
        assert r.compile is not None and r.compile.nvcc_runs == ["lean"], r.compile
        assert r.profile is not None and r.profile.custom_share and r.profile.custom_share > 0

