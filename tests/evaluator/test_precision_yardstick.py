"""The float64 yardstick of the precision check (`reference_worker._fp64`) runs on references
that a plain `deepcopy(model).double()` cannot run: functions made in `__init__` that close
over the float32 modules (L3/44), initial states drawn in forward without a dtype (L3/35)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

from kloop.evaluator.worker.reference_worker import _Float64Draws, float64_copy

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "exploits"))


class _Closes(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(4, 3)
        m = self.lin
        self.f = lambda x: m(x) * 2  # as L3/44's `self.mlpf`
        self.h0 = torch.randn(3)  # a plain attribute, not a buffer

    def forward(self, x):
        return self.f(x) + self.h0 + torch.randn(3)  # drawn without a dtype, as L3/35


def test_the_float64_copy_runs_what_the_float32_model_ran():
    model = _Closes()
    x = torch.randn(2, 4)
    torch.manual_seed(7)
    expected = model(x)
    with pytest.raises(RuntimeError):  # what the precision check used to meet
        import copy

        torch.manual_seed(7)
        copy.deepcopy(model).double()(x.double())
    twin = float64_copy(model)
    torch.manual_seed(7)
    with _Float64Draws():
        got = twin(x.double())
    assert got.dtype == torch.float64 and twin.h0.dtype == torch.float64
    # The same weights, state and random draws: equal up to float32 rounding.
    torch.testing.assert_close(got.float(), expected, rtol=1e-6, atol=1e-6)
    assert model.lin.weight.dtype == torch.float32  # the original is untouched


def test_explicit_dtypes_are_left_alone():
    with _Float64Draws():
        assert torch.zeros(2, dtype=torch.float32).dtype == torch.float32
        assert torch.arange(3).dtype == torch.int64
        assert torch.ones(2).dtype == torch.float64


@pytest.mark.parametrize("problem, sizes", [("L3/35", "LSTM_TINY"), ("L3/44", "MINIGPT_BLOCK_TINY")])
def test_the_precision_check_runs_on_references_a_deep_copy_could_not_widen(
        problem, sizes, tmp_path):
    import exploit_cases
    from eval_helpers import cpu_config

    from kloop.evaluator.harness.pipeline import evaluate
    from kloop.problems.registry import get_problem, reference_as_candidate

    source = reference_as_candidate(get_problem(problem).path.read_text())
    r = evaluate(problem, source, cpu_config(tmp_path / "cache", policy="strict",
                                             problem_overrides=getattr(exploit_cases, sizes)))
    assert r.status == "correct", r.error
    assert not [f for f in r.flags if f.startswith("precision_check_unavailable")], r.flags
    assert r.precision is not None and r.precision.ok, r.precision
    # The yardstick is the same computation: the float32 reference is within float32 rounding.
    assert r.precision.reference_rel_err < 1e-5, r.precision
