"""GPU side of the runtime anti-cheat rules (run on the H200): side streams, deferred work, CUDA
and Triton ghost kernels through the profiler, unlaunched CUDA kernels, uninitialised outputs on
CUDA, and honest candidates that must come out clean under every probe.

Run with `pytest tests/evaluator/test_anticheat_gpu.py -m gpu -v` on the GPU machine.
"""

from __future__ import annotations

import pytest
from eval_helpers import MLP_SMALL, candidate
from kloop.evaluator.common.config import EvalConfig
from kloop.evaluator.harness.pipeline import evaluate, evaluate_many

pytestmark = pytest.mark.gpu

MLP_MEDIUM = {"batch_size": 64, "input_size": 4096, "layer_sizes": [4096, 4096],
              "output_size": 2048}
# Work long enough on the GPU (milliseconds) that it is still running when forward returns.
MLP_BIG = {"batch_size": 1024, "input_size": 4096, "layer_sizes": [4096, 4096],
           "output_size": 4096}
SUSPICIOUS = {"no_custom_kernel", "deferred_work", "background_threads", "timer_tampering",
              "backend_flags_changed", "nondeterministic",
              "implausible_speedup", "launch_count_unavailable", "input_mutation"}


def gpu_config(cache_dir, **overrides) -> EvalConfig:
    fields = dict(device="cuda", cache_dir=cache_dir, baselines="eager",
                  problem_overrides=MLP_MEDIUM)
    fields.update(overrides)
    return EvalConfig(**fields)


def _rejected_by(r) -> set[str]:
    return {v.rule for v in r.violations if v.severity == "reject"}


def test_side_stream_output_is_still_being_written_when_forward_returns(cache_dir):
    r = evaluate("L3/1", candidate("side_stream.py"),
                 gpu_config(cache_dir, problem_overrides=MLP_BIG))
    assert r.status == "rejected" and "deferred_work" in _rejected_by(r), (r.violations, r.flags)


def test_switching_to_a_side_stream_in_the_timing_loop_is_caught_there(cache_dir):
    """The timed call's output is copied on the current stream when forward returns: work left
    on a stream it never joined is missing from the output the harness checks."""
    r = evaluate("L3/1", candidate("side_stream_phase.py"),
                 gpu_config(cache_dir, problem_overrides=MLP_BIG))
    assert r.status == "incorrect", (r.violations, r.flags, [t.kind for t in r.correctness])
    assert [t.kind for t in r.correctness if not t.passed] == ["timed"]
    assert r.timing is None


def test_ghost_and_unlaunched_kernels_on_the_gpu(cache_dir):
    names = ["ghost_cuda.py", "unlaunched_cuda.py", "ghost_triton.py", "unlaunched_triton.py",
             "empty_output.py"]
    results = dict(zip(names, evaluate_many([("L3/1", candidate(n)) for n in names],
                                            gpu_config(cache_dir), max_workers=2), strict=True))
    for name in names[:4]:
        r = results[name]
        assert (r.status, _rejected_by(r)) == ("rejected", {"no_custom_kernel"}), (
            name, r.violations, r.flags, r.error)
    assert "ghost kernels" in results["ghost_cuda.py"].violations[0].message
    assert "launched" in results["unlaunched_cuda.py"].violations[0].message
    assert "ghost kernels" in results["ghost_triton.py"].violations[0].message
    # Triton's launch hook saw no launch and the profiler confirmed it.
    assert "launched" in results["unlaunched_triton.py"].violations[0].message
    # An uninitialised output never holds a reference result: it was never in this process.
    assert results["empty_output.py"].status == "incorrect"


def test_honest_candidates_pass_every_probe_on_the_gpu(cache_dir):
    items = [("L3/1", candidate("mlp_triton.py")), ("L3/1", candidate("mlp_cuda_relu.py")),
             ("L3/43", candidate("attention_cuda.py"))]
    results = evaluate_many(items, gpu_config(cache_dir, problem_overrides={}), max_workers=3)
    for (problem, _), r in zip(items, results, strict=True):
        assert r.status == "correct", (problem, r.error, r.violations, r.flags)
        assert r.violations == [] and not SUSPICIOUS & set(r.flags), (problem, r.flags)
        assert [t.kind for t in r.correctness] == ["random"] * 5 + ["reparam"]
        t = r.timing
        assert t is not None and t.clock == "harness" and t.comparable
        assert t.handshake_ms is not None and t.worker_event_median_ms is not None
        assert r.precision is not None and r.precision.ok, r.precision


def test_kernelbench_policy_checks_every_timed_call_too(cache_dir):
    """kernelbench keeps KernelBench's tolerances and statistics, not its holes: its numbers
    come from the same trusted, checked calls."""
    r = evaluate("L3/1", candidate("side_stream_phase.py"),
                 gpu_config(cache_dir, policy="kernelbench", problem_overrides=MLP_BIG))
    assert r.status == "incorrect", (r.error, r.violations)
    assert [t.kind for t in r.correctness if not t.passed] == ["timed"]


def test_identity_and_probes_with_a_small_problem(cache_dir):
    """Microsecond kernels: the side-stream ratio must not flag an honest candidate."""
    r = evaluate("L3/1", candidate("mlp_triton.py"),
                 gpu_config(cache_dir, problem_overrides=MLP_SMALL, baselines="none"))
    assert r.status == "correct" and not SUSPICIOUS & set(r.flags), (r.flags, r.violations)


_ADD_ONE = '''
import triton
import triton.language as tl


@triton.jit
def add_one(X, Y, N, BLOCK: tl.constexpr):
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(Y + i, tl.load(X + i, mask=i < N) + 1.0, mask=i < N)
'''


def test_triton_launches_are_counted_by_the_hook_and_a_zero_by_the_profiler(tmp_path,
                                                                            monkeypatch):
    """A Triton-only candidate's first trial counts its launches with Triton's launch hook (the
    profiler's first session costs seconds of exclusive GPU time). A CUDA graph replay goes past
    the hook: the zero it leaves is counted again under the profiler, which sees the launches,
    so an honest candidate is never rejected on the hook's word; a candidate that calls the
    hook itself without launching is counted by the profiler too (zero)."""
    import importlib.util
    from types import SimpleNamespace

    import torch
    from kloop.evaluator.worker import trials
    from kloop.evaluator.worker.probes import custom_launches, hooked_triton_launches
    from kloop.evaluator.worker.trials import Loaded, _gpu_launches

    path = tmp_path / "add_one_kernel.py"
    path.write_text(_ADD_ONE)
    spec = importlib.util.spec_from_file_location("add_one_kernel", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    x = torch.randn(4096, device="cuda")
    y = torch.empty_like(x)

    def launch():
        mod.add_one[(4,)](x, y, x.numel(), BLOCK=1024)

    launch()  # compiled before the graph capture
    with hooked_triton_launches({"add_one"}) as seen:
        launch()
        launch()
    assert seen.count == 2
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        launch()
    with hooked_triton_launches({"add_one"}) as missed:
        graph.replay()
    assert missed.count == 0  # the premise: the hook cannot see a replay
    assert custom_launches(graph.replay, {"add_one"})[1] == 1
    loaded = Loaded(module=mod, model=torch.nn.Identity(), kernel_names={"add_one"})
    job = SimpleNamespace(backend="triton")
    assert _gpu_launches(loaded, job, graph.replay, graph.replay)[1] == 1  # the profiler's

    def no_profiler(*_a, **_k):
        raise AssertionError("a real launch through Triton's JIT needs no profiler")

    monkeypatch.setattr(trials, "custom_launches", no_profiler)
    assert _gpu_launches(loaded, job, launch, launch)[1] == 1  # the hook's count
    monkeypatch.undo()
    from kloop.evaluator.worker.probes import _launch_knobs
    from triton.compiler.compiler import LazyDict

    def fake() -> None:  # launches nothing, calls the hook with the kernel's name
        _launch_knobs().launch_enter_hook(LazyDict({"name": "add_one"}))

    assert _gpu_launches(loaded, job, fake, fake)[1] == 0
    torch.cuda.synchronize()
    assert torch.allclose(y, x + 1.0)
