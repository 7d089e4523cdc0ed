"""On CPU, Triton kernels that ran under the interpreter are also compiled for sm_90."""

from __future__ import annotations

from eval_helpers import candidate, cpu_config
from kloop.evaluator.harness.pipeline import evaluate_many


def test_triton_kernels_are_compiled_for_sm90_after_the_interpreter(cache_dir):
    honest, broken, wrong = evaluate_many(
        [("L3/1", candidate("mlp_triton.py")), ("L3/1", candidate("triton_compile_error.py")),
         ("L3/1", candidate("wrong_tile_triton.py"))],
        cpu_config(cache_dir, triton_aot=True), max_workers=2)

    assert honest.status == "correct", (honest.error, honest.compile)
    assert honest.compile is not None and honest.compile.ok
    assert honest.compile.target == "sm_90"

    # tl.dot of a 2-D and a 1-D block: rejected by the compiler, located in candidate.py.
    assert (broken.status, broken.stage_reached) == ("compile_error", "compile")
    [diag] = broken.compile.diagnostics
    assert (diag.file, diag.line) == ("candidate.py", 32)  # the tl.dot line
    assert "rank" in diag.message
    assert broken.timing is None

    # Its kernels compile for sm_90 after its correctness trials ran: it got that far.
    assert (wrong.status, wrong.stage_reached) == ("incorrect", "correctness")
    assert wrong.compile is not None and wrong.compile.ok
