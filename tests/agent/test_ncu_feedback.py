"""Hardware counters in the feedback: the one-line hints, the stall ranking, and the table the
next turn's prompt shows (prompts/_ncu.j2), from the ncu CSV in tests/data."""

from __future__ import annotations

from pathlib import Path

import pytest
from agent_fakes import FakeEvaluator, kernel
from kloop.agent.config import AgentConfig
from kloop.agent.ncu_hints import hint, stalls_text, top_stalls
from kloop.evaluator.common.result import NcuMetrics
from kloop.evaluator.harness.ncu import parse_ncu_kernels
from test_prompts import PROBLEM, render_feedback, turn_with

CSV = (Path(__file__).resolve().parents[1] / "data" / "ncu_three_kernels.csv").read_text()
LINEAR, NORM, SOFTMAX = parse_ncu_kernels(
    CSV, ["fused_linear_relu_kernel", "layernorm_kernel", "softmax_kernel"])

# A kernel that sits in no corner: both units half busy, full occupancy, stalls spread out.
PLAIN = NcuMetrics(kernel="k", duration_us=80.0, sm_throughput_pct=45.0,
                   dram_throughput_pct=40.0, theoretical_occupancy_pct=100.0, grid_size=4096,
                   sm_count=132, spill_bytes=0,
                   stalls={"long_scoreboard": 1.0, "wait": 1.0, "barrier": 1.0})


def with_(**fields) -> NcuMetrics:
    return PLAIN.model_copy(update=fields)


def test_stalls_are_ranked_by_their_share_of_stall_cycles():
    assert stalls_text(SOFTMAX) == "barrier 54%, long_scoreboard 28%, short_scoreboard 12%"
    top = top_stalls(LINEAR, 2)
    assert [s.reason for s in top] == ["math_pipe_throttle", "long_scoreboard"]
    assert top[0].ratio == pytest.approx(3.12) and top[0].share == pytest.approx(3.12 / 8.23)
    zeros = with_(stalls={"wait": 0.0, "barrier": 2.0})
    assert [s.reason for s in top_stalls(zeros)] == ["barrier"]
    assert stalls_text(with_(stalls={})) == "-" and top_stalls(with_(stalls={"wait": 0.0})) == []


def test_the_recorded_kernels_get_the_rule_their_numbers_call_for():
    assert hint(LINEAR).startswith("compute-bound (SM 73%, DRAM 31%)")
    assert hint(NORM).startswith("memory-bound at 87% of DRAM peak: only moving fewer bytes")
    assert hint(SOFTMAX).startswith("only 64 blocks for 132 SMs, so 68 SMs sit idle")


def test_each_rule_in_order():
    assert hint(with_(spill_bytes=512, dram_throughput_pct=90.0)).startswith(
        "registers spill to local memory (512 bytes stored per launch)")
    assert hint(with_(grid_size=100, dram_throughput_pct=90.0)).startswith("only 100 blocks")
    assert hint(with_(dram_throughput_pct=65.0, sm_throughput_pct=20.0)).startswith(
        "memory-bound (DRAM 65%, SM 20%): cut global memory traffic")
    assert hint(with_(sm_throughput_pct=85.0, dram_throughput_pct=70.0)).startswith(
        "compute-bound (SM 85%, DRAM 70%)")
    regs = with_(theoretical_occupancy_pct=25.0, registers_per_thread=168,
                 blocks_limit_registers=1, blocks_limit_shared_mem=2, blocks_limit_warps=8)
    assert hint(regs).startswith("registers (168/thread) cap occupancy at 25%")
    smem = regs.model_copy(update={"blocks_limit_shared_mem": 1, "blocks_limit_registers": 3,
                                   "dynamic_shared_bytes": 98304})
    assert hint(smem).startswith("shared memory (96 KB/block) caps occupancy at 25%")
    tie = regs.model_copy(update={"blocks_limit_shared_mem": 1})  # neither alone: next rule
    assert not hint(tie).startswith(("registers", "shared memory"))
    assert hint(with_(stalls={"long_scoreboard": 6.0, "wait": 2.0, "barrier": 2.0})) == (
        "top stall long_scoreboard (60% of stall cycles): warps wait on global or local memory "
        "loads; keep more loads in flight (software pipelining, num_stages, more independent "
        "work per thread) or reuse data already loaded")
    assert hint(with_(stalls={"dispatch_stall": 5.0, "wait": 1.0})) == (
        "top stall dispatch_stall (83% of stall cycles)")
    idle = with_(sm_throughput_pct=8.0, dram_throughput_pct=5.0)
    assert hint(idle).startswith("latency-bound (SM 8%, DRAM 5%)")
    assert hint(idle.model_copy(update={"duration_us": 3.2})).startswith(
        "a 3.2 us launch with memory and compute mostly idle")
    assert hint(PLAIN) == "no single limiter stands out (SM 45%, DRAM 40%)"
    assert hint(NcuMetrics(kernel="k")) == "no single limiter stands out (SM ?, DRAM ?)"


def _correct_with(ncu: list[NcuMetrics], only_old_field: bool = False):
    result = FakeEvaluator().evaluate(PROBLEM, kernel())
    update = {"ncu": ncu[0]} if only_old_field else {"ncu": ncu[0], "ncu_kernels": ncu}
    profile = result.profile.model_validate(result.profile.model_dump() | update)
    return result.model_copy(update={"profile": profile})


def test_the_feedback_shows_the_table_and_one_hint_per_kernel():
    text = render_feedback(turn_with(_correct_with([LINEAR, NORM, SOFTMAX])))
    lines = text.splitlines()
    head = lines.index("Hardware counters (Nsight Compute, one launch of each custom kernel "
                       "that dominates the device time):")
    assert lines[head + 1] == ("| kernel | us/launch | occupancy % (possible) | SM % | DRAM % "
                               "| regs/thread | smem/block | blocks x threads | top stalls |")
    assert lines[head + 3:head + 6] == [
        "| `fused_linear_relu_kernel` | 1210.0 | 24 (25) | 73 | 31 | 168 | 96.0 KB | 1024 x 256 "
        "| math_pipe_throttle 38%, long_scoreboard 24%, wait 15% |",
        "| `layernorm_kernel` | 41.2 | 81 (100) | 28 | 87 | 32 | 0 B | 8192 x 128 "
        "| long_scoreboard 85%, lg_throttle 10%, wait 3% |",
        "| `softmax_kernel` | 8.6 | 12 (100) | 10 | 12 | 40 | 4.0 KB | 64 x 1024 "
        "| barrier 54%, long_scoreboard 28%, short_scoreboard 12% |"]
    hints = [ln for ln in lines if ln.startswith("- `")]
    assert hints == [f"- `{n}`: {hint(m)}." for n, m in
                     [("fused_linear_relu_kernel", LINEAR), ("layernorm_kernel", NORM),
                      ("softmax_kernel", SOFTMAX)]]
    # The table comes after the profile and before the request for the next kernel.
    assert (text.index("Profile of one forward pass") < text.index("Hardware counters")
            < text.index("Make it faster"))


def test_the_table_is_left_out_without_counters_or_with_profile_feedback_off():
    with_counters = turn_with(_correct_with([LINEAR]))
    assert "Hardware counters" not in render_feedback(with_counters,
                                                      AgentConfig(profile_feedback=False))
    plain = turn_with(FakeEvaluator().evaluate(PROBLEM, kernel()))
    assert "Hardware counters" not in render_feedback(plain)


def test_a_record_from_before_the_kernel_list_still_shows_its_kernel():
    old = NcuMetrics(kernel="relu_kernel(float*, int)", duration_us=12.4, registers_per_thread=38)
    text = render_feedback(turn_with(_correct_with([old], only_old_field=True)))
    assert "| `relu_kernel` | 12.4 | - (-) | - | - | 38 | - | - x - | - |" in text
    assert "- `relu_kernel`: no single limiter stands out (SM ?, DRAM ?)." in text
