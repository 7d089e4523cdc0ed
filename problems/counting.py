"""Counting the work of one forward of a problem: FLOPs and bytes moved (`problems.cost` keeps
the results; `python -m problems.cost --write` runs this over the bundled set, about two minutes
on two cores, most of it in the recurrent problems, whose layers run step by step).

How, per forward of the full-size problem as the evaluator builds it:
- FLOPs: `torch.utils.flop_counter.FlopCounterMode` over one call on the `meta` device (shapes
  only, no data: a 2e9-parameter MLP costs nothing). It counts matrix products and
  convolutions, 2 FLOPs per multiply-add, and nothing else: elementwise ops, norms, softmax and
  reductions are left out, so the figure is a lower bound of the arithmetic, close where matmuls
  and convolutions dominate. LSTM/GRU/RNN layers reach the counter as their per-step matmuls;
  each such layer is also counted by formula (`rnn_flops`) and the two must agree (a torch that
  stopped decomposing them would count zero: the formula's figure is then kept, and said so).
- Bytes: every input and every parameter or buffer the forward touches, read once, plus every
  output, written once, at the problem's dtypes (fp32). No implementation can move less between
  the GPU's memory and its chip: the evaluator flushes the L2 cache before each timed call, so
  nothing is already on chip, and intermediates that spill only add to it. The bound ignores
  them, so for deep networks the real traffic is far above it.
"""

from __future__ import annotations

import logging
from typing import Any, Literal, NamedTuple

import torch
from kloop.problems.cost import CostTable, ProblemCost
from kloop.problems.registry import Problem
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves
from torch.utils.flop_counter import FlopCounterMode

log = logging.getLogger(__name__)

COUNTED = ("torch.utils.flop_counter.FlopCounterMode, one forward at full size on the meta device: "
           "matmul and convolution FLOPs only (2 per multiply-add); bytes: inputs and touched "
           "parameters and buffers read once, outputs written once (a lower bound; see "
           "problems/counting.py)")
_RNN_GATES = {"LSTM": 4, "GRU": 3, "RNN": 1}


class _Touched(TorchDispatchMode):
    """Records the storage of every tensor any op receives: which leaves the forward reads."""

    def __init__(self) -> None:
        super().__init__()
        self.storages: set[int] = set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        for t in tree_leaves((args, kwargs)):
            if isinstance(t, torch.Tensor):
                self.storages.add(_storage(t))
        return func(*args, **kwargs)


def _storage(t: torch.Tensor) -> int:
    return t.untyped_storage()._cdata


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


def rnn_flops(module: torch.nn.RNNBase, x: torch.Tensor) -> int:
    """Matmul FLOPs of one call of an LSTM, GRU or RNN on input `x` (unpacked): per layer,
    direction and step, the input and hidden products of all gates,
    2 * batch * gates * hidden * (layer input + hidden)."""
    if getattr(module, "proj_size", 0):
        raise ValueError("LSTM projections (proj_size) are not covered by the formula")
    if x.dim() == 2:  # unbatched: (seq, features)
        seq, batch = x.shape[0], 1
    else:
        seq, batch = (x.shape[1], x.shape[0]) if module.batch_first else (x.shape[0], x.shape[1])
    gates, hidden = _RNN_GATES[module.mode.split("_")[0]], module.hidden_size
    dirs = 2 if module.bidirectional else 1
    total = 0
    for layer in range(module.num_layers):
        width = module.input_size if layer == 0 else hidden * dirs
        total += dirs * 2 * seq * batch * gates * hidden * (width + hidden)
    return total


class _Built(NamedTuple):
    model: torch.nn.Module
    inputs: list[Any]
    method: Literal["meta", "meta_cpu_init"]


def _build(problem: Problem, overrides: dict[str, Any] | None) -> _Built:
    mod = problem.load_module(overrides)
    init = mod.get_init_inputs()
    try:
        with torch.device("meta"):
            return _Built(mod.Model(*init), mod.get_inputs(), "meta")
    except (RuntimeError, NotImplementedError) as e:
        # A constructor that reads values (Swin's drop-path rates call .item()) cannot run on
        # meta: build it for real on CPU (these are small) and move it.
        log.info("%s: built on CPU (%s)", problem.stem, str(e).splitlines()[0][:80])
        model = mod.Model(*init).to("meta")
        with torch.device("meta"):
            return _Built(model, mod.get_inputs(), "meta_cpu_init")


def count_problem(problem: Problem, overrides: dict[str, Any] | None = None) -> ProblemCost:
    """Count one forward of `problem` (at `overrides`' sizes, if given) on the meta device."""
    model, inputs, method = _build(problem, overrides)
    rnn_calls: list[tuple[str, int]] = []
    names = {m: n for n, m in model.named_modules()}
    hooks = [m.register_forward_pre_hook(lambda m, args: rnn_calls.append((names[m], rnn_flops(m, args[0]))))
             for m in model.modules() if isinstance(m, torch.nn.RNNBase)]
    counter, touched = FlopCounterMode(display=False), _Touched()
    with torch.device("meta"), torch.no_grad(), counter, touched:
        out = model(*inputs)
    for h in hooks:
        h.remove()
    by_op = {str(k): int(v) for k, v in counter.get_flop_counts()["Global"].items()}
    flops, note = int(counter.get_total_flops()), None
    if rnn_calls:
        extra = _rnn_flops_missed(problem, counter, rnn_calls)
        flops += extra
        note = (f"recurrent layers counted by formula ({extra:.4g} FLOPs): the counter saw none" if extra
                else "recurrent layers counted as their per-step matmuls, equal to the formula")
    leaves = {_storage(t): t for t in [*model.parameters(), *model.buffers(),
                                       *(x for x in tree_leaves(inputs) if isinstance(x, torch.Tensor))]}
    read = [t for key, t in leaves.items() if key in touched.storages]
    written = [t for t in tree_leaves(out) if isinstance(t, torch.Tensor)]
    moved = read + written
    if flops <= 0:
        raise ValueError(f"{problem.stem}: no matmul or convolution FLOPs counted")
    return ProblemCost(
        sha256=problem.sha256, flops=flops, bytes=sum(map(_nbytes, moved)),
        float_bytes=sum(_nbytes(t) for t in moved if t.is_floating_point()),
        method=method, flops_by_op=by_op, note=note)


def _rnn_flops_missed(problem: Problem, counter: FlopCounterMode, calls: list[tuple[str, int]]) -> int:
    """FLOPs of the recurrent layers the counter did not see: all of them by formula where it
    saw none, else 0 (a partial count that disagrees with the formula is an error)."""
    formula = sum(f for _, f in calls)
    names = {n for n, _ in calls}
    # Per-module keys are `<root class>.<module path>`.
    counted = sum(sum(v.values()) for key, v in counter.get_flop_counts().items()
                  if key != "Global" and key.split(".", 1)[-1] in names)
    if counted == 0:
        return formula
    if counted != formula:
        raise ValueError(f"{problem.stem}: recurrent layers counted {counted} FLOPs, formula says {formula}")
    return 0


def count_all(problems: list[Problem]) -> CostTable:
    out = {}
    for p in problems:
        out[p.stem] = count_problem(p)
        log.info("%s: %.4g FLOPs, %.4g bytes (%s)", p.stem, out[p.stem].flops, out[p.stem].bytes,
                 out[p.stem].method)
    return CostTable(torch=torch.__version__, counted=COUNTED, problems=out)


