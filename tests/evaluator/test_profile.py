"""Profiling feedback: torch.profiler summaries, custom/library classification, rendering, and
the Nsight Compute CSV parser."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from kloop.evaluator.harness.ncu import (
    dominant_custom_kernels,
    kernels_regex,
    ncu_command,
    ncu_metrics,
    parse_ncu_csv,
)
from kloop.evaluator.worker.profile import profile_forward, render_profile, summarise

REPO = Path(__file__).resolve().parents[2]


def _mlp():
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 8))
    return net, [torch.randn(32, 64)]


def test_cpu_profile_of_plain_torch_has_no_custom_share():
    net, inputs = _mlp()
    s = profile_forward(net, inputs, "cpu", set())
    assert s.activity == "cpu" and s.custom_share is None
    assert s.kernels and all(k.kind == "library" for k in s.kernels)
    assert abs(sum(k.share for k in s.kernels) - 1.0) < 1e-6  # fewer than TOP_KERNELS rows here
    assert abs(sum(k.time_ms for k in s.kernels) - s.total_ms) < 1e-6
    times = [k.time_ms for k in s.kernels]
    assert times == sorted(times, reverse=True)
    assert any(k.name == "aten::addmm" and k.calls == 2 for k in s.kernels)
    assert "no custom kernels" in s.text and len(s.text.splitlines()) <= 40


def test_custom_names_come_from_the_candidate_file(tmp_path):
    cand = tmp_path / "candidate.py"
    cand.write_text("import triton\n@triton.jit\ndef fused_gelu(x_ptr):\n    pass\n")

    def fn(x):
        with torch.profiler.record_function("fused_gelu"):  # what a custom launch looks like
            y = torch.tanh(x) * x
        return y + 1

    s = profile_forward(fn, [torch.randn(256, 256)], "cpu", candidate_path=cand)
    kinds = {k.name: k.kind for k in s.kernels}
    assert kinds["fused_gelu"] == "custom" and kinds["aten::add"] == "library"
    assert s.custom_share is not None and 0 < s.custom_share < 1


def test_classification_and_rendering_of_gpu_style_names():
    rows = [
        ("void fused_bn_relu_kernel<float, 256>(float const*, float*, int)", 500.0, 2),
        ("sm90_xmma_gemm_f32f32_tf32f32_f32_tn_n_tilesize128x128x32_cublas", 300.0, 1),
        ("triton_attention_fwd", 150.0, 4),
        ("void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<float>, "
         "std::array<char*, 3ul> >(int, at::native::CUDAFunctor_add<float>, std::array<char*, "
         "3ul>)", 40.0, 3),
        ("Memcpy DtoD (Device -> Device)", 10.0, 1),
    ] + [(f"cudnn_helper_{i}", 0.5, 1) for i in range(60)]
    s = summarise(rows, "cuda", {"fused_bn_relu_kernel", "triton_attention_fwd", "unused_kernel"})
    kinds = {k.name.split("(")[0]: k.kind for k in s.kernels}
    assert kinds["void fused_bn_relu_kernel<float, 256>"] == "custom"
    assert kinds["triton_attention_fwd"] == "custom"
    assert kinds["sm90_xmma_gemm_f32f32_tf32f32_f32_tn_n_tilesize128x128x32_cublas"] == "library"
    total = 500 + 300 + 150 + 40 + 10 + 30
    assert s.custom_share == pytest.approx(650 / total)
    assert s.total_ms == pytest.approx(total / 1000)
    lines = s.text.splitlines()
    assert len(lines) <= 40
    assert "custom kernels 63.1% of device time" in lines[0]
    assert lines[-1].startswith("(+") and "more" in lines[-1]
    assert all(len(line) < 140 for line in lines)
    assert len(render_profile(s, max_lines=8).splitlines()) == 8


def test_custom_kernels_that_never_ran_give_a_zero_share():
    s = summarise([("aten::mm", 10.0, 1)], "cpu", {"my_kernel"})
    assert s.custom_share == 0.0


# Written by hand in ncu's long CSV format (`--csv --print-units base`), with the report lines
# ncu interleaves and the application's own output.
NCU_CSV = """==PROF== Connected to process 4242 (/usr/bin/python3.12)
app says hello
==PROF== Profiling "fused_bn_relu_kernel" - 0: 0%....50%....100% - 9 passes
==PROF== Disconnected from process 4242
"ID","Process ID","Process Name","Host Name","Kernel Name","Context","Stream","Block Size","Grid Size","Device","CC","Section Name","Metric Name","Metric Unit","Metric Value"
"0","4242","python3.12","127.0.0.1","fused_bn_relu_kernel(float const*, float*, int)","1","7","(256, 1, 1)","(1024, 1, 1)","0","9.0","Command line profiler metrics","dram__throughput.avg.pct_of_peak_sustained_elapsed","%","81.37"
"0","4242","python3.12","127.0.0.1","fused_bn_relu_kernel(float const*, float*, int)","1","7","(256, 1, 1)","(1024, 1, 1)","0","9.0","Command line profiler metrics","gpu__time_duration.sum","nsecond","12,416"
"0","4242","python3.12","127.0.0.1","fused_bn_relu_kernel(float const*, float*, int)","1","7","(256, 1, 1)","(1024, 1, 1)","0","9.0","Command line profiler metrics","l1tex__t_bytes_pipe_lsu_mem_local_op_st.sum","byte","0"
"0","4242","python3.12","127.0.0.1","fused_bn_relu_kernel(float const*, float*, int)","1","7","(256, 1, 1)","(1024, 1, 1)","0","9.0","Command line profiler metrics","launch__registers_per_thread","register/thread","38"
"0","4242","python3.12","127.0.0.1","fused_bn_relu_kernel(float const*, float*, int)","1","7","(256, 1, 1)","(1024, 1, 1)","0","9.0","Command line profiler metrics","lts__t_sector_hit_rate.pct","%","47.05"
"0","4242","python3.12","127.0.0.1","fused_bn_relu_kernel(float const*, float*, int)","1","7","(256, 1, 1)","(1024, 1, 1)","0","9.0","Command line profiler metrics","sm__throughput.avg.pct_of_peak_sustained_elapsed","%","22.9"
"0","4242","python3.12","127.0.0.1","fused_bn_relu_kernel(float const*, float*, int)","1","7","(256, 1, 1)","(1024, 1, 1)","0","9.0","Command line profiler metrics","sm__warps_active.avg.pct_of_peak_sustained_active","%","88.1"
"1","4242","python3.12","127.0.0.1","other_kernel()","1","7","(32, 1, 1)","(1, 1, 1)","0","9.0","Command line profiler metrics","gpu__time_duration.sum","nsecond","999"
"""


def test_ncu_csv_parser():
    m = parse_ncu_csv(NCU_CSV, "fused_bn_relu")
    assert m is not None
    assert m.kernel.startswith("fused_bn_relu_kernel")
    assert m.duration_us == pytest.approx(12.416)
    assert m.dram_throughput_pct == pytest.approx(81.37)
    assert m.sm_throughput_pct == pytest.approx(22.9)
    assert m.achieved_occupancy_pct == pytest.approx(88.1)
    assert m.registers_per_thread == 38
    assert m.spill_bytes == 0
    assert m.l2_hit_rate_pct == pytest.approx(47.05)
    other = parse_ncu_csv(NCU_CSV, "^other")
    assert other is not None and other.duration_us == pytest.approx(0.999)
    assert other.registers_per_thread is None
    assert parse_ncu_csv(NCU_CSV, "absent_kernel") is None
    targets = dominant_custom_kernels(summarise(
        [("void fused_bn_relu_kernel<float>(float const*, float*, int)", 5.0, 1),
         ("sm90_xmma_gemm_cublas", 9.0, 1)], "cuda", {"fused_bn_relu_kernel"}), max_kernels=3)
    assert [t.name for t in targets] == ["fused_bn_relu_kernel"]
    anchored = parse_ncu_csv(NCU_CSV, kernels_regex([t.name for t in targets]))
    assert anchored is not None and anchored.registers_per_thread == 38
    assert parse_ncu_csv("==PROF== ERR_NVGPUCTRPERM", ".*") is None
    assert anchored.stalls == {} and anchored.grid_size is None  # not in this older output


@pytest.mark.gpu
def test_cuda_profile_lists_device_kernels():
    net, inputs = _mlp()
    net, inputs = net.cuda(), [x.cuda() for x in inputs]
    s = profile_forward(net, inputs, "cuda", {"not_a_real_kernel"})
    assert s.activity == "cuda" and s.custom_share == 0.0
    assert s.kernels and all(k.kind == "library" for k in s.kernels)
    assert not any(k.name.startswith("aten::") for k in s.kernels)  # device kernels, not ops
    assert s.total_ms > 0


@pytest.mark.gpu
def test_device_rows_agree_with_the_profilers_aggregate():
    """The raw device events, summed by name, are the rows `key_averages` gives for the device
    (which aggregates every CPU event too: the cost the raw read avoids)."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    from kloop.evaluator.worker.profile import device_rows

    net, inputs = _mlp()
    net, inputs = net.cuda(), [x.cuda() for x in inputs]
    with torch.no_grad(), profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as p:
        for _ in range(3):
            net(*inputs)
        torch.cuda.synchronize()
    raw = {name: (us, n) for name, us, n in device_rows(p)}
    agg = {r.key: (r.self_device_time_total, r.count) for r in p.key_averages()
           if r.device_type == DeviceType.CUDA and r.self_device_time_total > 0}
    assert raw and set(raw) == set(agg)
    for name, (us, n) in raw.items():
        assert n == agg[name][1] and n % 3 == 0, name  # every kernel once per forward
        assert us == pytest.approx(agg[name][0], rel=0.01, abs=1.0), name


@pytest.mark.gpu
@pytest.mark.skipif(shutil.which("ncu") is None, reason="needs ncu")
def test_ncu_on_a_tiny_kernel(tmp_path):
    script = tmp_path / "tiny.py"
    script.write_text(textwrap.dedent("""
        import torch
        x = torch.randn(1 << 20, device="cuda")
        y = x * 2.0 + 1.0
        torch.cuda.synchronize()
    """))
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    cmd = [sys.executable, str(script)]
    m = ncu_metrics(cmd, "elementwise", env, timeout_s=300)
    if m is None:
        out = subprocess.run(ncu_command(cmd, "elementwise"), capture_output=True, text=True,
                             env={**env, "LC_ALL": "C"}, timeout=300)
        text = out.stdout + out.stderr
        if "LibraryNotLoaded" in text or "ERR_NVGPUCTRPERM" in text:
            pytest.skip(f"ncu cannot read the counters on this machine: {text[-300:]}")
        pytest.fail(f"ncu produced no metrics: {text[-2000:]}")
    assert "elementwise" in m.kernel
    assert m.duration_us and m.duration_us > 0
    assert m.registers_per_thread and m.registers_per_thread > 0
    assert m.dram_throughput_pct is not None and 0 <= m.dram_throughput_pct <= 100
