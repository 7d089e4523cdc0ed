"""A small, curated set of Nsight Compute metrics for one kernel launch.

`ncu` replays the kernel once per metric pass, so we ask for one launch of one kernel (the
candidate's top custom kernel) and only the metrics a model can act on. Clock control is off so
the numbers match what the timing stage saw.
"""

from __future__ import annotations

import csv
import io
import logging
import re
import shutil
import subprocess
from collections.abc import Mapping, Sequence

from evaluator.resources import bare_name
from evaluator.result import NcuMetrics, ProfileSummary

log = logging.getLogger(__name__)

METRICS = {
    "gpu__time_duration.sum": "duration_us",
    "dram__throughput.avg.pct_of_peak_sustained_elapsed": "dram_throughput_pct",
    "sm__throughput.avg.pct_of_peak_sustained_elapsed": "sm_throughput_pct",
    "sm__warps_active.avg.pct_of_peak_sustained_active": "achieved_occupancy_pct",
    "launch__registers_per_thread": "registers_per_thread",
    # Bytes stored to local memory: register spills (and local arrays) made visible.
    "l1tex__t_bytes_pipe_lsu_mem_local_op_st.sum": "spill_bytes",
    "lts__t_sector_hit_rate.pct": "l2_hit_rate_pct",
}
_TIME_TO_US = {"nsecond": 1e-3, "ns": 1e-3, "usecond": 1.0, "us": 1.0, "msecond": 1e3,
               "ms": 1e3, "second": 1e6, "s": 1e6}
_BYTES = {"byte": 1, "kbyte": 1e3, "mbyte": 1e6, "gbyte": 1e9, "kibyte": 1024,
          "mibyte": 1024**2, "gibyte": 1024**3}
_INT_FIELDS = {"registers_per_thread", "spill_bytes"}


def ncu_command(cmd: Sequence[str], kernel_regex: str, ncu: str = "ncu") -> list[str]:
    return [
        ncu, "--clock-control", "none", "--kernel-name", f"regex:{kernel_regex}",
        "--launch-count", "1", "--csv", "--print-units", "base",
        "--metrics", ",".join(METRICS), *cmd,
    ]


def _number(text: str) -> float | None:
    # ncu groups thousands with commas; we run it under LC_ALL=C so commas are never decimals.
    cleaned = text.strip().replace(",", "")
    try:
        return float(cleaned)
    except ValueError:
        return None


def _scaled(field: str, value: float, unit: str) -> float:
    u = unit.strip().lower()
    if field == "duration_us":
        return value * _TIME_TO_US.get(u, 1e-3)
    if field == "spill_bytes":
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


def parse_ncu_csv(text: str, kernel_regex: str = ".*") -> NcuMetrics | None:
    """NcuMetrics for the first profiled launch whose kernel name matches `kernel_regex`."""
    pattern = re.compile(kernel_regex)
    # ncu filters on the bare function name but prints the demangled signature; accept either.
    rows = [r for r in _csv_rows(text)
            if pattern.search(r.get("Kernel Name", ""))
            or pattern.search(bare_name(r.get("Kernel Name", "")))]
    if not rows:
        return None
    first_id = rows[0].get("ID")
    kernel = rows[0]["Kernel Name"]
    values: dict[str, float | int] = {}
    for r in rows:
        if r.get("ID") != first_id:
            continue
        field = METRICS.get(r.get("Metric Name", ""))
        number = _number(r.get("Metric Value", ""))
        if field is None or number is None:
            continue
        scaled = _scaled(field, number, r.get("Metric Unit", ""))
        values[field] = int(round(scaled)) if field in _INT_FIELDS else scaled
    return NcuMetrics(kernel=kernel, **values)  # type: ignore[arg-type]


def top_custom_kernel_regex(summary: ProfileSummary) -> str | None:
    """An ncu `--kernel-name regex:` for the custom kernel with the most device time, if any."""
    custom = [k for k in summary.kernels if k.kind == "custom"]
    if summary.activity != "cuda" or not custom:
        return None
    return f"^{re.escape(bare_name(custom[0].name))}$"


def ncu_metrics(
    cmd: list[str],
    kernel_regex: str,
    env: Mapping[str, str] | None,
    timeout_s: float,
) -> NcuMetrics | None:
    """Run `cmd` under ncu and return the metrics of the first launch matching `kernel_regex`.

    None when ncu is absent, lacks permission for the counters, times out, or profiles nothing
    that matches; the reason is logged, since ncu metrics are optional feedback.
    """
    ncu = shutil.which("ncu", path=(env or {}).get("PATH")) or shutil.which("ncu")
    if ncu is None:
        log.info("ncu not found; skipping hardware counters")
        return None
    run_env = {**(env or {}), "LC_ALL": "C"}
    try:
        res = subprocess.run(ncu_command(cmd, kernel_regex, ncu), capture_output=True, text=True,
                             env=run_env, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        log.warning("ncu timed out after %.0f s", timeout_s)
        return None
    metrics = parse_ncu_csv(res.stdout, kernel_regex)
    if metrics is None:
        tail = (res.stdout + res.stderr)[-2000:]
        log.warning("ncu produced no metrics for %r (rc %s): %s", kernel_regex, res.returncode,
                    tail)
    return metrics
