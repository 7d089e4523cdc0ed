"""Every problem's full-size output shape, inferred on the meta device, matches its metadata."""

import pytest
import torch
from kloop.problems.registry import load_problem_set

PROBLEMS = list(load_problem_set())
# Constructors that call .item() cannot run on meta; they are small enough to build on CPU.
BUILD_ON_CPU = {"29_SwinMLP", "30_SwinTransformerV2"}
# LSTM/GRU forwards on meta decompose step by step and take ~50 s; a real CPU forward takes ~1 s.
RUN_ON_CPU = {f"{n}_{name}" for n, name in [
    (35, "LSTM"), (36, "LSTMHn"), (37, "LSTMCn"), (38, "LSTMBidirectional"), (39, "GRU"),
    (40, "GRUHidden"), (41, "GRUBidirectional"), (42, "GRUBidirectionalHidden"),
]}


def _shapes(out):
    if isinstance(out, tuple | list):
        return [list(o.shape) for o in out]
    return list(out.shape)


@pytest.mark.parametrize("problem", PROBLEMS, ids=[p.stem for p in PROBLEMS])
def test_full_size_output_shape_matches_metadata(problem):
    assert problem.meta.output_shape is not None
    module = problem.load_module()
    torch.manual_seed(42)
    init = module.get_init_inputs()
    torch.manual_seed(42)
    if problem.stem in RUN_ON_CPU:
        model = module.Model(*init)
        assert sum(p.numel() for p in model.parameters()) == problem.meta.params
        with torch.no_grad():
            assert _shapes(model(*module.get_inputs())) == problem.meta.output_shape
        return
    if problem.stem in BUILD_ON_CPU:
        model = module.Model(*init).to("meta")
    else:
        with torch.device("meta"):
            model = module.Model(*init)
    assert sum(p.numel() for p in model.parameters()) == problem.meta.params
    with torch.device("meta"), torch.no_grad():
        inputs = module.get_inputs()
        out = model(*inputs)
    assert _shapes(out) == problem.meta.output_shape
