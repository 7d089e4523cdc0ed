"""Nsight Compute for several kernels: which kernels are profiled, the one ncu command line that
asks for them, and the parsing of its CSV into one record per kernel.

`tests/data/ncu_three_kernels.csv` is in the layout `ncu --csv` prints (report lines, then one
row per launch and metric, units as ncu writes them when it scales values itself); it was
written for these tests on a machine without a GPU, with numbers of the size an H200 gives.
"""

from __future__ import annotations

import re
import stat
from pathlib import Path

import pytest
from kloop.evaluator.common.result import NcuMetrics, ProfileSummary
from kloop.evaluator.harness.ncu import (
    MAX_LAUNCHES,
    METRICS,
    STALL_METRICS,
    NcuTarget,
    dominant_custom_kernels,
    kernels_regex,
    ncu_command,
    ncu_kernel_metrics,
    parse_ncu_kernels,
)
from kloop.evaluator.worker.profile import summarise

CSV = (Path(__file__).resolve().parents[1] / "data" / "ncu_three_kernels.csv").read_text()
NAMES = ["fused_linear_relu_kernel", "layernorm_kernel", "softmax_kernel"]


def test_each_kernel_gets_its_first_launch_with_units_scaled():
    linear, norm, softmax = parse_ncu_kernels(CSV, NAMES)
    # The second launch of the linear kernel (ID 2, 1.19 ms) is not the one kept.
    assert linear.kernel == "fused_linear_relu_kernel"
    assert linear.duration_us == pytest.approx(1210.0)
    assert linear.sm_throughput_pct == pytest.approx(72.83)
    assert linear.achieved_occupancy_pct == pytest.approx(23.91)
    assert linear.theoretical_occupancy_pct == pytest.approx(25.0)
    assert linear.registers_per_thread == 168 and linear.spill_bytes == 0
    assert (linear.block_size, linear.grid_size, linear.sm_count) == (256, 1024, 132)
    assert (linear.static_shared_bytes, linear.dynamic_shared_bytes) == (0, 98300)
    assert linear.shared_bytes == 98300
    assert (linear.blocks_limit_registers, linear.blocks_limit_shared_mem,
            linear.blocks_limit_warps) == (1, 2, 8)
    assert set(linear.stalls) == set(STALL_METRICS.values())
    assert linear.stalls["math_pipe_throttle"] == pytest.approx(3.12)

    assert norm.duration_us == pytest.approx(41.22) and norm.grid_size == 8192
    assert norm.dram_throughput_pct == pytest.approx(86.94) and norm.shared_bytes == 0

    # A CUDA template kernel: ncu prints its signature, the profiler's bare name finds it.
    assert softmax.kernel.startswith("void softmax_kernel<float>")
    assert softmax.duration_us == pytest.approx(8.63)
    assert softmax.static_shared_bytes == 4100 and softmax.block_size == 1024


def test_kernels_are_returned_in_the_order_asked_and_missing_ones_left_out():
    got = parse_ncu_kernels(CSV, ["softmax_kernel", "never_launched", "layernorm_kernel"])
    assert [m.kernel.split("<")[0].split()[-1] for m in got] == ["softmax_kernel",
                                                                 "layernorm_kernel"]
    assert parse_ncu_kernels("==PROF== ERR_NVGPUCTRPERM\n", NAMES) == []


def test_a_record_round_trips_and_old_records_fill_the_kernel_list():
    linear = parse_ncu_kernels(CSV, NAMES)[0]
    assert NcuMetrics.model_validate_json(linear.model_dump_json()) == linear
    old = {"activity": "cuda", "total_ms": 1.0, "custom_share": 0.5,
           "ncu": {"kernel": "k", "duration_us": 3.0}}
    summary = ProfileSummary.model_validate(old)
    assert [m.kernel for m in summary.ncu_kernels] == ["k"]
    assert summary.ncu_kernels[0].stalls == {} and summary.ncu_kernels[0].shared_bytes is None


def _summary(rows, custom):
    return summarise(rows, "cuda", custom)


def test_dominant_kernels_cover_most_custom_time_up_to_the_cap():
    rows = [("fused_linear_relu_kernel", 600.0, 3), ("cublas_gemm", 900.0, 1),
            ("layernorm_kernel", 250.0, 2), ("void softmax_kernel<float>(float const*)", 60.0, 1),
            ("void softmax_kernel<c10::Half>(c10::Half const*)", 40.0, 1),
            ("bias_kernel", 50.0, 4)]
    s = _summary(rows, {"fused_linear_relu_kernel", "layernorm_kernel", "softmax_kernel",
                        "bias_kernel"})
    # Custom time 1000: the linear kernel alone is 60 %, with the layernorm 85 % >= 80 %.
    assert dominant_custom_kernels(s, 3) == [NcuTarget("fused_linear_relu_kernel", 3),
                                             NcuTarget("layernorm_kernel", 2)]
    assert dominant_custom_kernels(s, 1) == [NcuTarget("fused_linear_relu_kernel", 3)]
    # Template instances are one kernel to ncu: softmax's two count together (100 us, 2 calls).
    assert dominant_custom_kernels(s, 3, coverage=0.9)[2] == NcuTarget("softmax_kernel", 2)
    assert [t.name for t in dominant_custom_kernels(s, 5, coverage=1.0)] == [
        "fused_linear_relu_kernel", "layernorm_kernel", "softmax_kernel", "bias_kernel"]
    assert dominant_custom_kernels(_summary(rows, set()), 3) == []
    cpu = summarise([("fused_linear_relu_kernel", 5.0, 1)], "cpu", {"fused_linear_relu_kernel"})
    assert dominant_custom_kernels(cpu, 3) == []


def test_the_regex_matches_exactly_the_named_kernels():
    # ECMAScript and Python agree on this small syntax; ncu matches it against function names.
    pattern = re.compile(kernels_regex(["relu_kernel", "ln_kernel"]))
    assert pattern.search("relu_kernel") and pattern.search("ns::ln_kernel")
    assert pattern.search("relu_kernel<float>")
    assert not pattern.search("fused_relu_kernel") and not pattern.search("relu_kernel_v2")


def test_one_ncu_command_asks_for_every_metric_and_enough_launches():
    cmd = ncu_command(["python", "-m", "x"], kernels_regex(NAMES), "ncu", launch_count=6)
    assert cmd[cmd.index("--launch-count") + 1] == "6"
    assert cmd[cmd.index("--kernel-name") + 1] == "regex:" + kernels_regex(NAMES)
    metrics = cmd[cmd.index("--metrics") + 1].split(",")
    assert set(metrics) == set(METRICS) | set(STALL_METRICS) and len(metrics) == 32
    assert all(m.startswith("smsp__average_warps_issue_stalled_")
               and m.endswith("_per_issue_active.ratio") for m in STALL_METRICS)
    assert cmd[-3:] == ["python", "-m", "x"]


def _stand_in_ncu(tmp_path: Path, output: str) -> dict[str, str]:
    """An `ncu` on PATH that records its arguments and prints `output`, as ncu would after
    profiling (the real one needs a GPU; what is tested is kloop's side of the exchange)."""
    (tmp_path / "out.csv").write_text(output)
    exe = tmp_path / "ncu"
    exe.write_text(f'#!/bin/sh\nprintf "%s\\n" "$@" > {tmp_path}/argv\ncat {tmp_path}/out.csv\n')
    exe.chmod(exe.stat().st_mode | stat.S_IXUSR)
    return {"PATH": f"{tmp_path}:/usr/bin:/bin"}


def test_ncu_kernel_metrics_runs_ncu_once_for_all_targets(tmp_path):
    env = _stand_in_ncu(tmp_path, CSV)
    targets = [NcuTarget("fused_linear_relu_kernel", 3), NcuTarget("layernorm_kernel", 2),
               NcuTarget("softmax_kernel", 1)]
    got = ncu_kernel_metrics(["python", "fwd.py"], targets, env, timeout_s=30)
    assert [m.duration_us for m in got] == pytest.approx([1210.0, 41.22, 8.63])
    argv = (tmp_path / "argv").read_text().splitlines()
    assert argv[argv.index("--launch-count") + 1] == "6"  # one forward's launches of all three
    assert argv[argv.index("--kernel-name") + 1] == "regex:" + kernels_regex(NAMES)
    assert argv[-2:] == ["python", "fwd.py"]

    many = [NcuTarget("fused_linear_relu_kernel", 500)]
    ncu_kernel_metrics(["python", "fwd.py"], many, env, timeout_s=30)
    argv = (tmp_path / "argv").read_text().splitlines()
    assert argv[argv.index("--launch-count") + 1] == str(MAX_LAUNCHES)


def test_ncu_kernel_metrics_is_empty_when_ncu_reads_no_counters(tmp_path):
    env = _stand_in_ncu(tmp_path, "==ERROR== ERR_NVGPUCTRPERM - The user does not have "
                                  "permission to access NVIDIA GPU Performance Counters\n")
    assert ncu_kernel_metrics(["python"], [NcuTarget("k", 1)], env, timeout_s=30) == []
