"""CUDA candidates on a machine without a GPU: compile-checked with nvcc, then `not_run`.

nvcc against torch's headers takes a minute or more per source on 2 cores (results are cached per
candidate file in the evaluator's harness-only store), hence `slow`; the candidate that compiles
is the MLP kernel without its own `torch/extension.h` include (`light_cuda_candidate`: the same
check of a CUDA candidate, a fraction of the parse).
"""

from __future__ import annotations

import pytest
from eval_helpers import candidate, cpu_config, light_cuda_candidate

from kloop.evaluator.harness.pipeline import evaluate_many


@pytest.mark.slow
def test_cuda_candidates_are_compile_checked_without_a_gpu(cache_dir):
    ok, broken = evaluate_many(
        [("L3/1", light_cuda_candidate()), ("L3/1", candidate("cuda_compile_error.py"))],
        cpu_config(cache_dir), max_workers=2)
    assert (ok.status, ok.stage_reached, ok.backend) == ("not_run", "compile", "cuda")
    assert ok.compile is not None and ok.compile.ok and ok.compile.target == "sm_90"
    assert "not_run:no_gpu" in ok.flags
    assert ok.correctness == [] and ok.timing is None

    assert (broken.status, broken.stage_reached) == ("compile_error", "compile")
    [diag] = broken.compile.diagnostics
    assert (diag.file, diag.line) == ("candidate.py", 12)
    assert '"zero" is undefined' in diag.message
