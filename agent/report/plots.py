"""PNG plots of a report (matplotlib, Agg backend): budget curves, fast_p, speedup distributions.

Every run of a report is drawn on the same axes in the same colour across figures, so several
runs compare side by side. Figures are small: reports are read on screens and built in CI.
"""

from __future__ import annotations

import math
import textwrap
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.ticker import FixedLocator, FuncFormatter, NullLocator  # noqa: E402

from kloop.agent.report.curves import AXES, Curve  # noqa: E402
from kloop.agent.report.metrics import P_VALUES, Metrics, ProblemRow  # noqa: E402

DPI = 80
_P1 = P_VALUES.index(1.0)


def _colors(labels: list[str]) -> dict[str, tuple]:
    cmap = plt.get_cmap("tab10" if len(labels) <= 10 else "tab20")
    return {label: cmap(i % cmap.N) for i, label in enumerate(labels)}


def _save(fig, path: Path, legend: bool = False) -> Path:
    fig.tight_layout(rect=(0, 0.07 if legend else 0, 1, 1))
    fig.savefig(path, dpi=DPI, format="png")
    plt.close(fig)
    return path


def plot_curves(curves: list[Curve], labels: list[str], path: Path, metric: str = "fast") -> Path:
    """One panel per budget axis; `fast`: fast_1.0 vs eager (solid) and fast_0 (dashed);
    `geomean`: geomean over all problems of max(1, best speedup vs eager so far)."""
    colors = _colors(labels)
    fig, axes = plt.subplots(2, 4, figsize=(13, 5.6))
    panels = list(axes.flat)
    for ax in panels[len(AXES):]:  # a grid larger than the axes: the rest stay empty
        ax.axis("off")
    for ax, axis in zip(panels, AXES, strict=False):
        drawn = False
        why = "no run has this axis"
        for c in (c for c in curves if c.axis == axis):
            if not c.available or not c.points:
                why = c.note or why
                continue
            if all(p.x == 0 for p in c.points):
                why = "nothing spent on this axis (scripted replies cost nothing)"
                continue
            xs = [p.x for p in c.points]
            if metric == "fast":
                ax.step(xs, [p.fast_eager[_P1] for p in c.points], where="post", color=colors[c.label],
                        label=c.label)
                ax.step(xs, [p.correct for p in c.points], where="post", color=colors[c.label],
                        linestyle="--", alpha=0.6)
            else:
                ax.step(xs, [p.geomean_eager for p in c.points], where="post", color=colors[c.label],
                        label=c.label)
            drawn = True
        ax.set_xlabel(AXES[axis] + (" per problem" if curves and curves[0].scope == "problem" else ""),
                      fontsize=8)
        ax.tick_params(labelsize=7)
        if metric == "fast":
            ax.set_ylim(-0.02, 1.02)
        ax.set_title(f"{'fast_1.0 and correct' if metric == 'fast' else 'geomean max(1, x eager)'} "
                     f"by {AXES[axis]}", fontsize=8)
        if not drawn:
            _no_data(ax, why)
    # The geomean curve counts a problem without a correct kernel (or a slower one) as 1x, so
    # it is defined from the first point on; the label says so.
    ylabel = ("fast_1.0 (solid), correct (dashed)" if metric == "fast"
              else "geomean of max(1, speedup vs eager)")
    for ax in axes[:, 0]:
        ax.set_ylabel(ylabel, fontsize=8)
    return _save(fig, path, _legend(fig, axes, labels))


def _no_data(ax, why: str) -> None:
    """An empty panel says why it is empty instead of showing bare axes."""
    ax.set_xticks([])
    ax.set_yticks([])
    ax.text(0.5, 0.5, "\n".join(textwrap.wrap("no data: " + why, 36)), ha="center", va="center",
            transform=ax.transAxes, fontsize=7)


def _legend(fig, axes, labels: list[str]) -> bool:
    handles, names = [], []
    for ax in axes.flat:
        for h, n in zip(*ax.get_legend_handles_labels(), strict=True):
            if n not in names:
                handles.append(h)
                names.append(n)
    if not handles or len(labels) < 2:
        return False
    fig.legend(handles, names, loc="lower center", ncol=min(4, len(names)), fontsize=7)
    return True


def plot_fast_p(metrics: dict[str, Metrics], path: Path) -> Path:
    """fast_p against p, vs eager, vs torch.compile and vs the fastest baseline of each kernel,
    with bootstrap intervals."""
    colors = _colors(list(metrics))
    names = {"eager": "eager", "compile": "torch.compile", "best": "the fastest baseline"}
    fig, axes = plt.subplots(1, 3, figsize=(12, 3.4), sharey=True)
    for ax, vs in zip(axes, names, strict=True):
        for i, (label, m) in enumerate(metrics.items()):
            ests = [f.vs(vs) for f in m.fast_p]
            ps = [f.p + 0.02 * (i - (len(metrics) - 1) / 2) for f in m.fast_p]
            ys = [e.value if e.value is not None else math.nan for e in ests]
            err = [[max(0.0, y - e.lo) if e.lo is not None else 0.0 for y, e in zip(ys, ests, strict=True)],
                   [max(0.0, e.hi - y) if e.hi is not None else 0.0 for y, e in zip(ys, ests, strict=True)]]
            ax.errorbar(ps, ys, yerr=err, marker="o", markersize=3, capsize=2, color=colors[label],
                        label=label, linewidth=1)
        cpu = vs != "compile" and any(m.host_clock for m in metrics.values())
        rule = ("\n(a speedup counts when its interval's low end clears p)"
                if any(m.with_interval for m in metrics.values()) else "")
        ax.set_title(f"fast_p vs {names[vs]}" + rule + ("\n(CPU times: not comparable)" if cpu else ""),
                     fontsize=9)
        ax.set_xlabel("p (speedup threshold)", fontsize=8)
        ax.set_xticks(list(P_VALUES))
        ax.tick_params(labelsize=7)
        ax.set_ylim(-0.02, 1.02)
    axes[0].set_ylabel("share of all problems", fontsize=8)
    return _save(fig, path, _legend(fig, axes, list(metrics)))


_NICE = [m * 10.0 ** e for e in range(-3, 4) for m in (1, 2, 5)]


def _speedup_ticks(ax, values: list[float]) -> None:
    """Ticks at 1-2-5 steps over the data (1x always), each labelled once: the log axis's own
    minor ticks repeated labels (`2x` twice) once two of them rounded alike."""
    lo, hi = min([*values, 1.0]), max([*values, 1.0])
    ticks = [t for t in _NICE if lo / 1.5 <= t <= hi * 1.5]
    if len(ticks) < 3:  # all within a few percent of each other: the ends and 1x
        ticks = sorted({float(f"{v:.3g}") for v in (lo, 1.0, hi)})
    ax.xaxis.set_major_locator(FixedLocator(ticks))
    ax.xaxis.set_minor_locator(NullLocator())
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}x"))
    ax.tick_params(axis="x", which="both", labelsize=6)


def plot_speedups(rows: dict[str, list[ProblemRow]], path: Path) -> Path:
    """Best speedup of every correct problem, one row of dots per run, log scale, 1x marked."""
    labels = list(rows)
    colors = _colors(labels)
    fig, axes = plt.subplots(1, 2, figsize=(9, 0.9 + 0.45 * len(labels)), sharey=True)
    for ax, vs in zip(axes, ("eager", "compile"), strict=True):
        any_dot = False
        for y, label in enumerate(labels):
            dots = [(v, r.speedup_ci.get(vs)) for r in rows[label] if r.correct
                    for v in [r.speedup_vs_eager if vs == "eager" else r.speedup_vs_compile]
                    if v is not None and v > 0]
            if dots:
                vals = [v for v, _ in dots]
                ax.scatter(vals, [y] * len(vals), s=14, color=colors[label], alpha=0.7)
                # The interval over paired rounds, where measured: a bar through the dot.
                bars = [(v, ci) for v, ci in dots if ci is not None]
                if bars:
                    ax.errorbar([v for v, _ in bars], [y] * len(bars), fmt="none", ecolor=colors[label],
                                alpha=0.7, capsize=2, linewidth=1,
                                xerr=[[max(0.0, v - ci.low) for v, ci in bars],
                                      [max(0.0, ci.high - v) for v, ci in bars]])
                any_dot = True
        if not any_dot:
            correct = any(r.correct for rs in rows.values() for r in rs)
            _no_data(ax, ("no correct kernel has a speedup: runtimes timed with a host clock "
                          f"(no GPU) or no {'torch.compile' if vs == 'compile' else 'eager'} "
                          "baseline timed") if correct else "no correct kernel")
            ax.set_title(f"best speedup vs {'torch.compile' if vs == 'compile' else 'eager'}",
                         fontsize=9)
            continue
        ax.axvline(1.0, color="grey", linewidth=0.8, linestyle=":")
        if any_dot:
            ax.set_xscale("log")
            _speedup_ticks(ax, [v for rs in rows.values() for r in rs if r.correct
                                for v in [r.speedup_vs_eager if vs == "eager" else r.speedup_vs_compile]
                                if v is not None and v > 0])
        cpu = any(r.correct and r.comparable is False for rs in rows.values() for r in rs)
        bars = any(vs in r.speedup_ci for rs in rows.values() for r in rs if r.correct)
        ax.set_title(f"best speedup vs {'torch.compile' if vs == 'compile' else 'eager'} (correct "
                     "only, x)" + (", bars: 95 % interval" if bars else "")
                     + ("\n(CPU times: not comparable)" if cpu else ""), fontsize=9)
        ax.tick_params(labelsize=7)
    axes[0].set_yticks(range(len(labels)))  # (a no-data panel cleared its own ticks only)
    axes[0].set_yticklabels(labels, fontsize=7)
    axes[0].set_ylim(-0.6, len(labels) - 0.4)
    return _save(fig, path)
