"""Assemble a report from run directories, and write it (Markdown, PNGs, HTML, JSON).

`build_report` reads only the run directories (through `load`); `write_report` draws and renders
only from the `Report` record, so the JSON holds every number the pages show.
"""

from __future__ import annotations

import logging
from datetime import datetime
from pathlib import Path

from kloop.agent.budget import Spend
from kloop.agent.report import DEFAULT_BOOTSTRAP, plots
from kloop.agent.report.bound import PEAKS, DevicePeaks
from kloop.agent.report.curves import Curve, MatchedBudget, Scope, matched_budgets, run_curves
from kloop.agent.report.load import Loaded, RunData, load_targets
from kloop.agent.report.metrics import (
    P_VALUES,
    Counts,
    Metrics,
    ProblemRow,
    by_hardware,
    compute_metrics,
    count,
    problem_rows,
)
from kloop.agent.store import kloop_version
from kloop.agent.tally import total_spend
from kloop.agent.tree import Tree, TreeRow
from pydantic import BaseModel, ConfigDict, Field

log = logging.getLogger(__name__)

REPORT_SCHEMA_VERSION = 1


class _Record(BaseModel):
    model_config = ConfigDict(extra="forbid")


class RunReport(_Record):
    label: str
    path: str
    run_id: str
    kind: str
    source_run: str | None = None
    model: str
    strategy: str
    context: str
    backend: str
    policy: str
    device: str
    tolerance: float | None
    seed: int
    axes: dict[str, str] = Field(default_factory=dict)
    imported: bool = False
    warnings: list[str] = Field(default_factory=list)
    degenerate: list[str] = Field(default_factory=list)
    """Problems whose output does not depend on the input at this run's tolerance."""
    problems: list[ProblemRow]
    metrics: Metrics
    metrics_excluding_degenerate: Metrics | None = None
    counts: Counts
    spend: Spend
    """Totals over the run; `wall_s` is the span from the first turn's start to the last's end."""
    curves: list[Curve]
    trees: dict[str, list[TreeRow]] = Field(default_factory=dict)
    """Tree-search runs: problem id -> its search tree, drawn (agent/tree.py)."""
    by_hardware: dict[str, Metrics] = Field(default_factory=dict)
    """Where a run's problems were judged on more than one device (a Ray cluster of mixed GPU
    models): the metrics over each device's problems alone (`metrics.by_hardware`)."""


class SeedGroup(_Record):
    """Runs that differ only in seed, summarised together (CIs over seeds and problems)."""

    label: str
    runs: list[str]
    seeds: list[int]
    metrics: Metrics
    metrics_excluding_degenerate: Metrics | None = None


class Report(_Record):
    schema_version: int = REPORT_SCHEMA_VERSION
    kloop_version: str
    sources: list[str]
    bootstrap_n: int
    bootstrap_seed: int
    scope: Scope
    p_values: list[float] = Field(default_factory=lambda: list(P_VALUES))
    notes: list[str] = Field(default_factory=list)
    runs: list[RunReport]
    seed_groups: list[SeedGroup] = Field(default_factory=list)
    matched: list[MatchedBudget] = Field(default_factory=list)
    peaks: list[DevicePeaks] = Field(default_factory=list)
    """Datasheet peaks of the GPUs the best kernels were timed on, where the table has them
    (`agent.report.bound`): what the speed-of-light fractions divide by."""
    unknown_gpus: list[str] = Field(default_factory=list)
    """GPUs of best kernels that the peaks table lacks (no fraction for them)."""


def _strategy(run: RunData) -> str:
    s = run.config.strategy
    if s.kind == "beam":
        return f"beam k={s.beam_width} m={s.expand} rounds={s.rounds} turns={s.turns}"
    if s.kind == "tree":
        return (f"tree roots={s.roots} expansions={s.expansions} turns={s.turns} c={s.exploration:g} "
                f"max_children={s.max_children}")
    return f"{s.kind} {s.samples}x{s.turns}"


def _spend(run: RunData) -> Spend:
    total = total_spend(run.turns, run.episodes)
    if run.turns:
        first = min(datetime.fromisoformat(t.started_at) for t in run.turns)
        last = max(datetime.fromisoformat(t.finished_at) for t in run.turns)
        total = total.model_copy(update={"wall_s": (last - first).total_seconds()})
    return total


def _run_warnings(run: RunData, m: Metrics) -> list[str]:
    out = list(run.warnings)
    if run.imported and m.unevaluated:
        out.append(f"{m.unevaluated} imported problem(s) not evaluated yet: run `kloop replay {run.path} --rescore`")
    devices = sorted({t.eval.env.device_name for t in run.turns
                      if t.eval is not None and t.eval.env is not None and t.eval.device != "cpu"})
    if len(devices) > 1:
        out.append(f"judged on {len(devices)} GPU models ({', '.join(devices)}): the section "
                   "'By hardware' gives the metrics of each alone")
    if m.host_clock:
        out.append(f"{m.host_clock} best kernel(s) timed with a host clock (CPU): their speedups are "
                   "ratios of CPU times vs eager, not comparable with GPU numbers")
    if m.below_clock_resolution:
        out.append(f"{m.below_clock_resolution} best kernel(s) flagged below_clock_resolution: their models "
                   "run below the clock's resolution, so their speedups are dominated by serving overhead")
    if m.not_run:
        out.append(f"{m.not_run} problem(s) could not run here (not_run: CUDA code without a GPU); "
                   "rescore on a GPU")
    if m.correct_untimed:
        out.append(f"{m.correct_untimed} correct kernel(s) without a speedup: they count for fast_0 only")
    if m.correct_no_compile > m.correct_untimed:
        out.append(f"{m.correct_no_compile} correct kernel(s) without a torch.compile baseline: "
                   "fast_p vs compile counts them for p = 0 only")
    if m.correct_no_compile_ro > m.correct_untimed:
        out.append(f"{m.correct_no_compile_ro} correct kernel(s) without a torch.compile reduce-overhead "
                   "baseline (not asked for, failed, or judged before it existed): fast_p vs compile_ro "
                   "counts them for p = 0 only")
    unpriced = sum(t.spend.unpriced_calls for t in run.turns)
    if unpriced and not run.imported:
        out.append(f"{unpriced} call(s) of unknown cost: dollar totals leave them out")
    ncu = [t.eval.stage_seconds["ncu"] for t in run.turns
           if t.eval is not None and "ncu" in t.eval.stage_seconds]
    if ncu:  # `eval.ncu: true`: part of every evaluation's time, so already inside eval_s
        out.append(f"ncu hardware counters: {sum(ncu):.1f} s of the "
                   f"{sum(t.spend.eval_s for t in run.turns):.1f} eval s ({len(ncu)} evaluations)")
    return out


def run_report(run: RunData, n_boot: int, seed: int, scope: Scope) -> RunReport:
    rows = problem_rows(run)
    metrics = compute_metrics([rows], n_boot, seed)
    degenerate = [r.problem_id for r in rows if r.degenerate]
    cfg = run.config
    return RunReport(
        label=run.label, path=str(run.path), run_id=run.record.run_id, kind=run.record.kind,
        source_run=run.record.source_run, model=cfg.model.spec, strategy=_strategy(run),
        context=cfg.agent.context if cfg.agent.context in ("full", "last")
        else f"{cfg.agent.context}={cfg.agent.context_k}",
        backend=cfg.agent.backend, policy=cfg.eval.policy,
        device=cfg.eval.device, tolerance=run.tolerance, seed=cfg.seed,
        axes=run.axes, imported=run.imported, warnings=_run_warnings(run, metrics),
        degenerate=degenerate, problems=rows, metrics=metrics,
        metrics_excluding_degenerate=compute_metrics([rows], n_boot, seed, exclude_degenerate=True)
        if degenerate else None,
        counts=count(run, rows), spend=_spend(run), curves=run_curves(run, scope),
        trees=_trees(run) if cfg.strategy.kind == "tree" else {},
        by_hardware={hw: compute_metrics([group], n_boot, seed)
                     for hw, group in by_hardware(rows).items()})


def _trees(run: RunData) -> dict[str, list[TreeRow]]:
    parents = {e.episode_key: e.parent for e in run.episodes}
    return {p.id: Tree([t for t in run.turns if t.problem_id == p.id], parents).rows()
            for p in run.problems if any(t.problem_id == p.id for t in run.turns)}


def _seed_groups(runs: list[RunData], reports: list[RunReport], n_boot: int, seed: int) -> list[SeedGroup]:
    groups: dict[str, list[int]] = {}
    for i, run in enumerate(runs):
        groups.setdefault(run.seed_group, []).append(i)
    out = []
    for members in groups.values():
        seeds = [runs[i].config.seed for i in members]
        if len(members) < 2 or len(set(seeds)) < 2:
            continue
        first = runs[members[0]]
        if first.axes:
            label = "__".join(v for k, v in first.axes.items() if k != "seed")
        else:
            label = f"{first.label} (+{len(members) - 1} seeds)"
        rows = [reports[i].problems for i in members]
        has_degenerate = any(r.degenerate for rs in rows for r in rs)
        out.append(SeedGroup(
            label=label, runs=[runs[i].label for i in members], seeds=seeds,
            metrics=compute_metrics(rows, n_boot, seed),
            metrics_excluding_degenerate=compute_metrics(rows, n_boot, seed, exclude_degenerate=True)
            if has_degenerate else None))
    return out


def build_report(paths: list[Path], n_boot: int = DEFAULT_BOOTSTRAP, seed: int = 0, scope: Scope = "problem",
                 loaded: Loaded | None = None) -> Report:
    """Everything a report shows, computed from the run and experiment directories in `paths`."""
    loaded = loaded or load_targets(paths)
    reports = [run_report(r, n_boot, seed, scope) for r in loaded.runs]
    gpus = {p.gpu for r in reports for p in r.problems if p.correct and p.gpu is not None}
    return Report(
        kloop_version=kloop_version(), sources=[str(p) for p in paths], bootstrap_n=n_boot,
        bootstrap_seed=seed, scope=scope, notes=loaded.notes, runs=reports,
        seed_groups=_seed_groups(loaded.runs, reports, n_boot, seed),
        matched=matched_budgets([c for r in reports for c in r.curves]) if len(reports) > 1 else [],
        peaks=[PEAKS[g] for g in sorted(gpus & PEAKS.keys())], unknown_gpus=sorted(gpus - PEAKS.keys()))


class ReportFiles(_Record):
    markdown: str
    html: str | None = None
    json_path: str | None = None
    plots: list[str]


def draw(report: Report, out: Path) -> dict[str, str]:
    """The report's PNGs, written into `out`; returns {name: file name}."""
    labels = [r.label for r in report.runs]
    curves = [c for r in report.runs for c in r.curves]
    files = {
        "curves_fast": plots.plot_curves(curves, labels, out / "curves_fast.png", "fast"),
        "curves_geomean": plots.plot_curves(curves, labels, out / "curves_geomean.png", "geomean"),
        "fast_p": plots.plot_fast_p({r.label: r.metrics for r in report.runs}, out / "fast_p.png"),
        "speedups": plots.plot_speedups({r.label: r.problems for r in report.runs}, out / "speedups.png"),
    }
    return {name: path.name for name, path in files.items()}


def write_report(report: Report, out: Path, html: bool = False, json: bool = False) -> ReportFiles:
    """Write report.md and its PNGs into `out` (and report.html, report.json if asked)."""
    from kloop.agent.report import document, markdown
    from kloop.agent.report import html as html_mod

    out.mkdir(parents=True, exist_ok=True)
    images = draw(report, out)
    doc = document.build(report, images)
    md_path = out / "report.md"
    md_path.write_text(markdown.render(doc))
    files = ReportFiles(markdown=str(md_path), plots=[str(out / f) for f in images.values()])
    if html:
        html_path = out / "report.html"
        html_path.write_text(html_mod.render(doc, out))
        files.html = str(html_path)
    if json:
        json_path = out / "report.json"
        json_path.write_text(report.model_dump_json(indent=1) + "\n")
        files.json_path = str(json_path)
    return files
