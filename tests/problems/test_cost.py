"""FLOP and byte counts per forward (`problems.counting`) against hand counts, and the committed
table (`problems/level3_cost.json`) against the problem files."""

from __future__ import annotations

import torch
from kloop.problems.cost import COST_FILE, cost_of, load_costs, main, stale
from kloop.problems.counting import _rnn_flops_missed, count_problem
from kloop.problems.registry import get_problem, load_problem_set
from torch.utils.flop_counter import FlopCounterMode


def test_mlp_counts_match_a_hand_count():
    # L3/1 at full size: 128 x 16384 -> 16384 -> 16384 -> 8192, fp32, on the meta device.
    cost = count_problem(get_problem("L3/1"))
    m, dims = 128, [16384, 16384, 16384, 8192]
    layers = list(zip(dims, dims[1:], strict=False))
    assert cost.flops == sum(2 * m * k * n for k, n in layers) == 171_798_691_840
    params = sum(k * n + n for k, n in layers)
    assert cost.bytes == 4 * (m * dims[0] + params + m * dims[-1])
    assert cost.float_bytes == cost.bytes and cost.bytes_at("bf16") == cost.bytes // 2
    assert cost.method == "meta" and cost.flops_by_op == {"aten.addmm": cost.flops}


def test_meta_count_equals_a_count_on_real_tensors():
    problem, sizes = get_problem("L3/4"), {"batch_size": 2}
    mod = problem.load_module(sizes)
    model, inputs = mod.Model(*mod.get_init_inputs()), mod.get_inputs()
    counter = FlopCounterMode(display=False)
    with counter, torch.no_grad():
        model(*inputs)
    assert count_problem(problem, sizes).flops == counter.get_total_flops() > 0


def test_recurrent_layers_count_as_their_matmuls_and_agree_with_the_formula():
    # 2 * batch * gates * hidden * (layer input + hidden) per layer, direction and step.
    lstm = count_problem(get_problem("L3/35"), {"batch_size": 2, "sequence_length": 4})
    b, t, h, g = 2, 4, 256, 4
    layers = 2 * b * t * g * h * (128 + h) + 5 * 2 * b * t * g * h * (h + h)
    assert lstm.flops == layers + 2 * b * h * 10  # the final Linear on the last step
    assert lstm.note == "recurrent layers counted as their per-step matmuls, equal to the formula"

    gru = count_problem(get_problem("L3/41"), {"batch_size": 2, "seq_len": 3})
    b, t, g = 2, 3, 3
    per_dir = 2 * b * t * g * h * (128 + h) + 5 * 2 * b * t * g * h * (2 * h + h)
    assert gru.flops == 2 * per_dir


def test_recurrent_layers_the_counter_missed_are_counted_by_formula():
    assert _rnn_flops_missed(get_problem("L3/35"), FlopCounterMode(display=False), [("lstm", 1234)]) == 1234


def test_bytes_count_only_the_parameters_the_forward_reads(tmp_path):
    (tmp_path / "1_Unused.py").write_text(
        "import torch\nimport torch.nn as nn\n\n\n"
        "class Model(nn.Module):\n"
        "    def __init__(self):\n"
        "        super().__init__()\n"
        "        self.used = nn.Linear(8, 4)\n"
        "        self.spare = nn.Linear(1000, 1000)\n\n"
        "    def forward(self, x):\n"
        "        return self.used(x)\n\n\n"
        "def get_inputs():\n    return [torch.rand(3, 8)]\n\n\n"
        "def get_init_inputs():\n    return []\n")
    cost = count_problem(load_problem_set(tmp_path).get("1_Unused"))
    assert cost.flops == 2 * 3 * 8 * 4
    assert cost.bytes == 4 * (3 * 8 + 8 * 4 + 4 + 3 * 4)


def test_committed_table_covers_every_problem_at_its_current_version():
    problems = load_problem_set().filter(level=3)
    costs = load_costs()
    assert len(problems) == 50 and set(costs) == {p.stem for p in problems}
    assert stale(problems, costs) == [] and main(["--check"]) == 0
    for p in problems:
        c = cost_of(p)
        assert c is not None and c.flops > 0 and 0 < c.float_bytes <= c.bytes, p.stem
    methods = {p.stem for p in problems if costs[p.stem].method == "meta_cpu_init"}
    assert methods == {"29_SwinMLP", "30_SwinTransformerV2"}
    assert COST_FILE.name == "level3_cost.json"


def test_a_copy_of_a_problem_keeps_its_cost_and_a_changed_one_has_none(tmp_path):
    src = get_problem("L3/1").path.read_text()
    for name, text in (("same", "# a copy in a KernelBench checkout\n" + src),
                       ("changed", src.replace("batch_size = 128", "batch_size = 64"))):
        (tmp_path / name / "level3").mkdir(parents=True)
        (tmp_path / name / "level3" / "1_MLP.py").write_text(text)
    assert cost_of(load_problem_set(tmp_path / "same").get("L3/1")) == cost_of(get_problem("L3/1"))
    assert cost_of(load_problem_set(tmp_path / "changed").get("L3/1")) is None
