"""The speed-of-light bound: the least time a GPU could take for one forward of a problem, from
the problem's counted work (`problems.cost`) and the GPU's datasheet peaks.

    sol_ms = max(flops / peak FLOP/s, bytes / peak memory bandwidth)

Which compute peak: fp32 runs use the FP32 peak of the CUDA cores (no tensor cores). Under the
strict policy TF32 is off, so neither the reference nor a candidate held to 1e-4 (and to the
float64 precision check) gets TF32 tensor-core throughput; a kernel that does use it anyway
(possible under `kernelbench`, which keeps PyTorch's TF32 defaults) can show a fraction above 1.
fp16 and bf16 runs use the dense (no 2:4 sparsity) FP16/BF16 tensor-core peak.

The fraction of speed of light is sol_ms / runtime_ms: 1 is the bound, and, since both counts
are lower bounds (only matmul and convolution FLOPs; each input, weight and output moved once),
real kernels sit well below it on problems with large intermediates. runtime_ms is the number of
record, the harness clock's, which keeps each call's serving overhead (0.05-0.3 ms on the H200):
kernels of well under a millisecond sit lower still.
"""

from __future__ import annotations

from typing import NamedTuple

from kloop.evaluator.common.result import EvalResult
from kloop.problems.cost import ProblemCost
from pydantic import BaseModel, ConfigDict

_DATASHEET_NOTE = ("NVIDIA datasheet; tensor-core figures there are with 2:4 sparsity, halved "
                   "here for dense")


class DevicePeaks(BaseModel):
    """Peak rates of one GPU model, from its datasheet."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    device_name: str
    """As `torch.cuda.get_device_name` reports it (`EnvInfo.device_name`)."""
    label: str
    fp32_tflops: float
    """FP32 on the CUDA cores (non-tensor)."""
    tf32_tflops: float
    """TF32 tensor cores, dense (shown for reference; not used for fp32 runs, see above)."""
    half_tflops: float
    """FP16 and BF16 tensor cores, dense."""
    hbm_tb_s: float
    """Peak memory bandwidth, TB/s (1e12 bytes per second)."""
    source: str

    def peak_flops(self, precision: str) -> float:
        """FLOP/s the bound uses for a run at `precision` (fp32, fp16, bf16)."""
        return (self.fp32_tflops if precision == "fp32" else self.half_tflops) * 1e12


# Datasheet numbers (SXM unless named): H200: FP32 67 TFLOPS, TF32 989 and FP16/BF16 1,979
# (both with sparsity), 4.8 TB/s HBM3e. H100 SXM: the same compute, 3.35 TB/s HBM3. H100 PCIe:
# FP32 51, TF32 756, FP16/BF16 1,513 (with sparsity), 2.0 TB/s HBM2e. The dense tensor-core
# rates, half of those, agree with NVIDIA's Hopper whitepaper as tabulated at
# glennklockwood.com/garden/processors/h100 (TF32 494.7, BF16 989.4, FP32 66.9 TFLOPS).
PEAKS: dict[str, DevicePeaks] = {p.device_name: p for p in (
    DevicePeaks(device_name="NVIDIA H200", label="H200 SXM", fp32_tflops=67.0, tf32_tflops=494.5,
                half_tflops=989.5, hbm_tb_s=4.8,
                source="nvidia.com/en-us/data-center/h200 (" + _DATASHEET_NOTE + ")"),
    DevicePeaks(device_name="NVIDIA H100 80GB HBM3", label="H100 SXM", fp32_tflops=67.0,
                tf32_tflops=494.5, half_tflops=989.5, hbm_tb_s=3.35,
                source="nvidia.com/en-us/data-center/h100 (" + _DATASHEET_NOTE + ")"),
    DevicePeaks(device_name="NVIDIA H100 PCIe", label="H100 PCIe", fp32_tflops=51.0,
                tf32_tflops=378.0, half_tflops=756.5, hbm_tb_s=2.0,
                source="nvidia.com/en-us/data-center/h100 (" + _DATASHEET_NOTE + ")"),
)}


def peaks_for(device_name: str | None) -> DevicePeaks | None:
    """The peaks of a GPU model by its reported name; None for a GPU not in the table (or CPU)."""
    return PEAKS.get(device_name or "")


def sol_ms(cost: ProblemCost, peaks: DevicePeaks, precision: str) -> float:
    """Speed-of-light time of one forward, in milliseconds."""
    compute_s = cost.flops / peaks.peak_flops(precision)
    memory_s = cost.bytes_at(precision) / (peaks.hbm_tb_s * 1e12)
    return max(compute_s, memory_s) * 1e3


class Bound(NamedTuple):
    """One result against the speed of light of the GPU that judged it."""

    gpu: str | None
    sol_ms: float | None = None
    sol_fraction: float | None = None
    """sol_ms / runtime_ms: 1 is the bound."""


def bound_of(cost: ProblemCost | None, ev: EvalResult, precision: str) -> Bound:
    """The bound of a timed result on a GPU in the table; no numbers on CPU, for a GPU not in
    the table, a problem never counted, or overridden sizes (the counts are of full size)."""
    gpu = ev.env.device_name if ev.env is not None and ev.device != "cpu" else None
    peaks = peaks_for(gpu)
    runtime = ev.runtime_ms if ev.timing is not None and ev.timing.comparable else None
    if peaks is None or cost is None or ev.problem_overrides or not runtime:
        return Bound(gpu)
    sol = sol_ms(cost, peaks, precision)
    return Bound(gpu, sol, sol / runtime)
