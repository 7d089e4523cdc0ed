"""One profiled forward: where the time goes, and how much of it is the candidate's own kernels.

Runs inside the candidate process, on candidates already judged correct. On a GPU it reads the
device activity (kernels, copies); on CPU it reads operator self-times, where the Triton
interpreter's launches show up as ranges named after the kernel (see triton_aot's recorder).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from kloop.evaluator.common.backend import custom_kernel_names
from kloop.evaluator.common.resources import bare_name
from kloop.evaluator.common.result import ProfileKernel, ProfileSummary

TOP_KERNELS = 20
_NAME_WIDTH = 90


def _rows(prof: Any, activity: str) -> list[tuple[str, float, int]]:
    """(name, microseconds, calls) for every event that takes time on the profiled device."""
    if activity == "cuda":
        return device_rows(prof)
    out = []
    for row in prof.key_averages():  # self times: a range's children are not counted twice
        us = float(row.self_cpu_time_total)
        if us > 0:
            out.append((row.key, us, int(row.count)))
    return out


def device_rows(prof: Any) -> list[tuple[str, float, int]]:
    """(name, microseconds, calls) of the device's events (kernels, copies, sets), summed by
    name from the profiler's raw results. Device events do not nest, so their durations are
    their self times; `key_averages()` gives the same rows after aggregating every CPU event
    too, which took most of a second under the device lock on an LSTM (17,000 events)."""
    from torch.autograd import DeviceType

    acc: dict[str, list[float]] = {}
    for e in prof.profiler.kineto_results.events():
        if e.device_type() != DeviceType.CUDA:
            continue
        row = acc.setdefault(e.name(), [0.0, 0])
        row[0] += e.duration_ns() / 1000.0
        row[1] += 1
    return [(name, us, int(n)) for name, (us, n) in acc.items() if us > 0]


def classify(name: str, custom_names: set[str]) -> str:
    """`custom` when the kernel is one the candidate wrote, else `library`."""
    return "custom" if bare_name(name) in custom_names or name in custom_names else "library"


def summarise(
    rows: Sequence[tuple[str, float, int]], activity: str, custom_names: set[str]
) -> ProfileSummary:
    """A ProfileSummary from (name, microseconds, calls) rows; shares are of the total time."""
    total_us = sum(us for _, us, _ in rows)
    kernels = [
        ProfileKernel(
            name=name, kind=classify(name, custom_names),  # type: ignore[arg-type]
            time_ms=us / 1000.0, share=us / total_us if total_us else 0.0, calls=calls,
        )
        for name, us, calls in sorted(rows, key=lambda r: -r[1])
    ]
    custom_us = sum(k.time_ms for k in kernels if k.kind == "custom") * 1000.0
    custom_share = (custom_us / total_us if total_us else 0.0) if custom_names else None
    summary = ProfileSummary(
        activity=activity,  # type: ignore[arg-type]
        total_ms=total_us / 1000.0,
        custom_share=custom_share,
        kernels=kernels[:TOP_KERNELS],
    )
    summary.text = render_profile(summary, hidden=kernels[TOP_KERNELS:])
    return summary


def profile_forward(
    fn: Callable[..., Any],
    inputs: Sequence[Any],
    device: str,
    custom_names: set[str] | None = None,
    warmup: int = 1,
    *,
    candidate_path: str | Path | None = None,
) -> ProfileSummary:
    """Profile one `fn(*inputs)` after `warmup` unprofiled calls, under `torch.no_grad()`.

    Kernels named in `custom_names` (default: `custom_kernel_names` of the file at
    `candidate_path`) count as the candidate's own.
    """
    import torch
    from torch.profiler import ProfilerActivity, profile

    if custom_names is None:
        source = Path(candidate_path).read_text() if candidate_path else ""
        custom_names = custom_kernel_names(source) if source else set()

    activity = "cuda" if device.startswith("cuda") else "cpu"
    # On a GPU, device activity only: the CPU's events are never read there.
    activities = [ProfilerActivity.CUDA if activity == "cuda" else ProfilerActivity.CPU]

    def sync() -> None:
        if activity == "cuda":
            torch.cuda.synchronize()

    with torch.no_grad():
        for _ in range(warmup):
            fn(*inputs)
        sync()
        with profile(activities=activities) as prof:
            fn(*inputs)
            sync()
    return summarise(_rows(prof, activity), activity, custom_names)


def _short(name: str) -> str:
    return name if len(name) <= _NAME_WIDTH else name[: _NAME_WIDTH - 1] + "…"


def render_profile(
    summary: ProfileSummary, max_lines: int = 40, hidden: Sequence[ProfileKernel] = ()
) -> str:
    """Compact text for the model: a header, then one line per kernel, at most `max_lines`."""
    where = "device" if summary.activity == "cuda" else "CPU"
    if summary.custom_share is None:
        custom = "no custom kernels in this candidate"
    else:
        custom = f"custom kernels {summary.custom_share:.1%} of {where} time"
    head = f"Profile of one forward ({summary.activity}): total {summary.total_ms:.3f} ms, {custom}"
    if summary.activity == "cpu":
        head += " (CPU run: host times, Triton kernels interpreted; not GPU timings)"
    lines = [
        head,
        f"{'share':>6}  {'ms':>9}  {'calls':>5}  {'kind':<7}  name",
    ]
    rows = list(summary.kernels)
    rest = list(hidden)
    room = max_lines - len(lines) - (1 if rest else 0)
    if len(rows) > room:
        room -= 1 if not rest else 0
        rest = rows[room:] + rest
        rows = rows[:room]
    for k in rows:
        lines.append(f"{k.share:>6.1%}  {k.time_ms:>9.4f}  {k.calls:>5}  {k.kind:<7}  {_short(k.name)}")
    if rest:
        share = sum(k.share for k in rest)
        lines.append(f"(+{len(rest)} more, {share:.1%} of the time)")
    return "\n".join(lines)
