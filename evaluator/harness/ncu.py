"""A small, curated set of Nsight Compute metrics for the custom kernels that dominate a profile.

`ncu` replays each profiled launch once per metric pass, so we ask for one ncu run over one
launch of each of a few kernels (the candidate's custom kernels that hold most of its device
time) and only the metrics a model can act on. Clock control is off so the numbers match what
the timing stage saw.
"""

from __future__ import annotations

import csv
import io
import logging
import re
import shutil
import subprocess
from collections.abc import Mapping, Sequence
from typing import NamedTuple

from kloop.evaluator.common.resources import bare_name
from kloop.evaluator.common.result import NcuMetrics, ProfileSummary

log = logging.getLogger(__name__)

METRICS = {
    "gpu__time_duration.sum": "duration_us",
    "dram__throughput.avg.pct_of_peak_sustained_elapsed": "dram_throughput_pct",
    "sm__throughput.avg.pct_of_peak_sustained_elapsed": "sm_throughput_pct",
    "sm__warps_active.avg.pct_of_peak_sustained_active": "achieved_occupancy_pct",
    "sm__maximum_warps_per_active_cycle_pct": "theoretical_occupancy_pct",
    "launch__registers_per_thread": "registers_per_thread",
    # Bytes stored to local memory: register spills (and local arrays) made visible.
    "l1tex__t_bytes_pipe_lsu_mem_local_op_st.sum": "spill_bytes",
    "lts__t_sector_hit_rate.pct": "l2_hit_rate_pct",
    "launch__block_size": "block_size",
    "launch__grid_size": "grid_size",
    "launch__shared_mem_per_block_static": "static_shared_bytes",
    "launch__shared_mem_per_block_dynamic": "dynamic_shared_bytes",
    # Blocks one SM could hold under each resource alone: the smallest is what caps occupancy.
    "launch__occupancy_limit_registers": "blocks_limit_registers",
    "launch__occupancy_limit_shared_mem": "blocks_limit_shared_mem",
    "launch__occupancy_limit_warps": "blocks_limit_warps",
    "device__attribute_multiprocessor_count": "sm_count",
}
# Warp-stall reasons, each as warps stalled per issued instruction (the breakdown of Nsight
# Compute's "warp cycles per issued instruction"). `selected` (the warp that issues) and
# `not_selected` (eligible warps left waiting: a sign of enough parallelism) are not stalls a
# kernel writer removes, so they are not asked for.
STALL_REASONS = (
    "long_scoreboard", "short_scoreboard", "mio_throttle", "lg_throttle", "math_pipe_throttle",
    "tex_throttle", "barrier", "membar", "wait", "branch_resolving", "dispatch_stall", "drain",
    "imc_miss", "no_instruction", "sleeping", "misc",
)
STALL_METRICS = {f"smsp__average_warps_issue_stalled_{r}_per_issue_active.ratio": r
                 for r in STALL_REASONS}
# ncu counts --launch-count over every launch that matches the kernel filter, so asking for one
# launch of each of several kernels means asking for as many launches as one forward makes of
# all of them; this caps the replays (each launch is replayed once per metric pass) for models
# that call a kernel hundreds of times per forward. Kernels past the cap go unprofiled.
MAX_LAUNCHES = 24
# The share of the custom kernels' device time the profiled kernels should cover.
COVERAGE = 0.8

_TIME_TO_US = {"nsecond": 1e-3, "ns": 1e-3, "usecond": 1.0, "us": 1.0, "msecond": 1e3,
               "ms": 1e3, "second": 1e6, "s": 1e6}
_BYTES = {"byte": 1, "kbyte": 1e3, "mbyte": 1e6, "gbyte": 1e9, "kibyte": 1024,
          "mibyte": 1024**2, "gibyte": 1024**3}
_BYTE_FIELDS = {"spill_bytes", "static_shared_bytes", "dynamic_shared_bytes"}
_INT_FIELDS = {"registers_per_thread", "block_size", "grid_size", "blocks_limit_registers",
               "blocks_limit_shared_mem", "blocks_limit_warps", "sm_count", *_BYTE_FIELDS}


class NcuTarget(NamedTuple):
    """A custom kernel to profile: its bare name and its launches in one forward."""

    name: str
    calls: int


def dominant_custom_kernels(summary: ProfileSummary, max_kernels: int,
                            coverage: float = COVERAGE) -> list[NcuTarget]:
    """The custom kernels with the most device time, most first, until they cover `coverage` of
    the custom kernels' time or number `max_kernels`. Instances of one template share a bare
    name (what ncu filters on) and count as one kernel. Empty off the GPU."""
    if summary.activity != "cuda":
        return []
    by_name: dict[str, list[float]] = {}
    for k in summary.kernels:
        if k.kind == "custom":
            time_calls = by_name.setdefault(bare_name(k.name), [0.0, 0])
            time_calls[0] += k.time_ms
            time_calls[1] += k.calls
    custom_ms = sum(t for t, _ in by_name.values())
    if summary.custom_share:  # counts custom kernels past the summary's top rows too
        custom_ms = summary.custom_share * summary.total_ms
    chosen: list[NcuTarget] = []
    covered = 0.0
    for name, (ms, calls) in sorted(by_name.items(), key=lambda kv: -kv[1][0]):
        if len(chosen) == max_kernels or (chosen and covered >= coverage * custom_ms):
            break
        chosen.append(NcuTarget(name, int(calls)))
        covered += ms
    return chosen


def kernels_regex(names: Sequence[str]) -> str:
    """An ncu `--kernel-name regex:` for exactly these kernels. ncu matches it against the
    function name; the optional namespace and template bounds keep `relu_kernel` from matching
    `fused_relu_kernel`."""
    alternatives = "|".join(re.escape(n) for n in names)
    return f"(^|::)({alternatives})(<|$)"


def ncu_command(cmd: Sequence[str], kernel_regex: str, ncu: str = "ncu",
                launch_count: int = 1) -> list[str]:
    return [
        ncu, "--clock-control", "none", "--kernel-name", f"regex:{kernel_regex}",
        "--launch-count", str(launch_count), "--csv", "--print-units", "base",
        "--metrics", ",".join([*METRICS, *STALL_METRICS]), *cmd,
    ]


def _number(text: str) -> float | None:
    # ncu groups thousands with commas; we run it under LC_ALL=C so commas are never decimals.
    cleaned = text.strip().replace(",", "")
    try:
        return float(cleaned)
    except ValueError:
        return None


def _scaled(field: str, value: float, unit: str) -> float:
    u = unit.strip().lower().split("/")[0]  # "Kbyte/block" is a size in Kbyte
    if field == "duration_us":
        return value * _TIME_TO_US.get(u, 1e-3)
    if field in _BYTE_FIELDS:
        return value * _BYTES.get(u, 1)
    return value


def _csv_rows(text: str) -> list[dict[str, str]]:
    """Rows of the long-format table (one row per metric), skipping ==PROF== and app output."""
    lines = text.splitlines()
    for i, line in enumerate(lines):
        if line.startswith('"') and '"Metric Name"' in line and '"Kernel Name"' in line:
            body = [ln for ln in lines[i:] if ln.startswith('"')]
            return list(csv.DictReader(io.StringIO("\n".join(body))))
    return []


def _launches(text: str) -> list[list[dict[str, str]]]:
    """The rows of each profiled launch (ncu's `ID`), in launch order."""
    by_id: dict[str, list[dict[str, str]]] = {}
    for row in _csv_rows(text):
        by_id.setdefault(row.get("ID", ""), []).append(row)
    return list(by_id.values())


def _metrics_of(rows: list[dict[str, str]]) -> NcuMetrics:
    values: dict[str, float | int] = {}
    stalls: dict[str, float] = {}
    for r in rows:
        name = r.get("Metric Name", "")
        number = _number(r.get("Metric Value", ""))
        if number is None:
            continue
        if name in STALL_METRICS:
            stalls[STALL_METRICS[name]] = number
            continue
        field = METRICS.get(name)
        if field is None:
            continue
        scaled = _scaled(field, number, r.get("Metric Unit", ""))
        values[field] = int(round(scaled)) if field in _INT_FIELDS else scaled
    return NcuMetrics(kernel=rows[0]["Kernel Name"], stalls=stalls, **values)  # type: ignore[arg-type]


def _matches(pattern: re.Pattern[str], kernel: str) -> bool:
    # ncu filters on the function name but prints the demangled signature; accept either.
    return bool(pattern.search(kernel) or pattern.search(bare_name(kernel)))


def parse_ncu_csv(text: str, kernel_regex: str = ".*") -> NcuMetrics | None:
    """NcuMetrics for the first profiled launch whose kernel name matches `kernel_regex`."""
    pattern = re.compile(kernel_regex)
    first = next((rows for rows in _launches(text) if _matches(pattern, rows[0]["Kernel Name"])),
                 None)
    return None if first is None else _metrics_of(first)


def parse_ncu_kernels(text: str, names: Sequence[str]) -> list[NcuMetrics]:
    """The first profiled launch of each kernel in `names` (bare names), in the order of
    `names`; kernels ncu did not profile are left out."""
    first: dict[str, list[dict[str, str]]] = {}
    for rows in _launches(text):
        first.setdefault(bare_name(rows[0]["Kernel Name"]), rows)
    return [_metrics_of(first[n]) for n in names if n in first]


def run_ncu(cmd: list[str], kernel_regex: str, env: Mapping[str, str] | None, timeout_s: float,
            launch_count: int = 1) -> str | None:
    """ncu's output (stdout, the CSV among the application's lines) for `cmd`; None when ncu is
    absent or times out (logged: ncu metrics are optional feedback)."""
    ncu = shutil.which("ncu", path=(env or {}).get("PATH")) or shutil.which("ncu")
    if ncu is None:
        log.info("ncu not found; skipping hardware counters")
        return None
    run_env = {**(env or {}), "LC_ALL": "C"}
    try:
        res = subprocess.run(ncu_command(cmd, kernel_regex, ncu, launch_count),
                             capture_output=True, text=True, env=run_env, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        log.warning("ncu timed out after %.0f s", timeout_s)
        return None
    if not _csv_rows(res.stdout):
        log.warning("ncu produced no metrics for %r (rc %s): %s", kernel_regex, res.returncode,
                    (res.stdout + res.stderr)[-2000:])
    return res.stdout


def ncu_metrics(cmd: list[str], kernel_regex: str, env: Mapping[str, str] | None,
                timeout_s: float) -> NcuMetrics | None:
    """Run `cmd` under ncu and return the metrics of the first launch matching `kernel_regex`.

    None when ncu is absent, lacks permission for the counters, times out, or profiles nothing
    that matches.
    """
    out = run_ncu(cmd, kernel_regex, env, timeout_s)
    return None if out is None else parse_ncu_csv(out, kernel_regex)


def ncu_kernel_metrics(cmd: list[str], targets: Sequence[NcuTarget],
                       env: Mapping[str, str] | None, timeout_s: float) -> list[NcuMetrics]:
    """One ncu run over `cmd` for one launch of each target kernel; what ncu could not profile
    (absent, no permission, timed out, past `MAX_LAUNCHES`) is left out."""
    names = [t.name for t in targets]
    launches = min(max(sum(t.calls for t in targets), len(targets)), MAX_LAUNCHES)
    out = run_ncu(cmd, kernels_regex(names), env, timeout_s, launches)
    return [] if out is None else parse_ncu_kernels(out, names)
