"""The report as a list of plain blocks (headings, paragraphs, tables, images), built once from a
`Report` and rendered by `markdown.py` and `html.py`, so both pages say exactly the same."""

from __future__ import annotations

from dataclasses import dataclass, field

from kloop.agent.report.build import Report, RunReport
from kloop.agent.report.curves import AXES, MatchedBudget
from kloop.agent.report.metrics import P_VALUES, VS, Counts, Estimate, Metrics, ProblemRow
from kloop.evaluator.common.result import SpeedupInterval

_P1 = P_VALUES.index(1.0)
MAX_SIDE_BY_SIDE = 8


@dataclass
class Heading:
    text: str
    level: int = 2


@dataclass
class Para:
    text: str


@dataclass
class Bullets:
    items: list[str]


@dataclass
class Table:
    header: list[str]
    rows: list[list[str]]


@dataclass
class Image:
    file: str
    """File name inside the report directory."""
    alt: str


Block = Heading | Para | Bullets | Table | Image


@dataclass
class Document:
    title: str
    blocks: list[Block] = field(default_factory=list)

    def add(self, *blocks: Block) -> None:
        self.blocks.extend(blocks)


# -- formatting -----------------------------------------------------------------------------
def share(e: Estimate, ci: bool = True) -> str:
    if e.value is None:
        return "-"
    text = f"{e.value:.2f}"
    return text + (f" [{e.lo:.2f}, {e.hi:.2f}]" if ci and e.lo is not None and e.hi is not None else "")


def speed(e: Estimate | float | None, ci: bool = True) -> str:
    if isinstance(e, float) or e is None:
        return "-" if e is None else f"{e:.3g}x"
    if e.value is None:
        return "-"
    text = f"{e.value:.3g}x"
    return text + (f" [{e.lo:.3g}, {e.hi:.3g}]" if ci and e.lo is not None and e.hi is not None else "")


def speed_ci(x: float | None, ci: SpeedupInterval | None) -> str:
    """A measured speedup with its interval over paired rounds, where it has one."""
    text = speed(x)
    return text + (f" [{ci.low:.3g}, {ci.high:.3g}]" if x is not None and ci is not None else "")


def fraction(x: float | None) -> str:
    return "-" if x is None else f"{x:.2g}"


def _num(x: float, digits: int = 3) -> str:
    return f"{x:,.0f}" if abs(x) >= 1000 else f"{x:.{digits}g}"


def _counts(d: dict[str, int]) -> str:
    return ", ".join(f"{k} {v}" for k, v in d.items()) or "-"


# -- sections -------------------------------------------------------------------------------
_SUMMARY_HEADER = ["run", "problems", "correct", "fast_1.0 eager", "fast_1.0 compile", "fast_1.0 best",
                   "geomean eager", "geomean compile", "geomean best", "median eager", "faster than compile",
                   "custom share"]
_VS_NAMES = {"eager": "eager", "compile": "compile", "compile_ro": "compile reduce-overhead",
             "best": "best of them"}


def _summary_row(label: str, m: Metrics) -> list[str]:
    correct = f"{m.correct:g}/{m.problems}"
    return [label, str(m.problems), correct, share(m.fast_p[_P1].vs_eager), share(m.fast_p[_P1].vs_compile),
            share(m.fast_p[_P1].vs_best), speed(m.geomean_vs_eager), speed(m.geomean_vs_compile),
            speed(m.geomean_vs_best), speed(m.median_vs_eager, ci=False), share(m.faster_than_compile, ci=False),
            "-" if m.custom_share_mean is None else f"{m.custom_share_mean:.2f}"]


def _fast_p_table(items: list[tuple[str, Metrics]]) -> Table:
    rows = [[label, _VS_NAMES[vs]] + [share(f.vs(vs)) for f in m.fast_p] for label, m in items for vs in VS]
    return Table(["run", "vs"] + [f"fast_{p:g}" for p in P_VALUES], rows)


def _spend_table(runs: list[RunReport]) -> Table:
    rows = []
    for r in runs:
        s = r.spend
        turns = sum(p.turns for p in r.problems)
        cost = "unknown" if r.imported else f"${s.cost_usd:.4f}" + (" +unpriced" if s.unpriced_calls else "")
        tokens = "unknown" if r.imported or s.unmetered_calls else _num(s.total_tokens)
        rows.append([r.label, str(turns), str(s.calls), tokens, cost, _num(s.eval_s),
                     _num(s.gpu_s), _num(s.wall_s)])
    return Table(["run", "turns", "LLM calls", "tokens", "cost", "eval s", "GPU s (held)",
                  "wall-clock s"], rows)


def _config_table(runs: list[RunReport]) -> Table:
    rows = [[r.label, r.model, r.strategy, r.context, r.backend, r.policy,
             "-" if r.tolerance is None else f"{r.tolerance:g}", r.device, str(r.seed), r.kind]
            for r in runs]
    return Table(["run", "model", "strategy", "context", "backend", "policy", "tol", "device", "seed", "kind"], rows)


def _notes(report: Report) -> list[str]:
    notes = list(report.notes)
    for r in report.runs:
        notes += [f"{r.label}: {w}" for w in r.warnings]
    return notes


def _degenerate(doc: Document, report: Report) -> None:
    runs = [r for r in report.runs if r.metrics_excluding_degenerate is not None]
    if not runs:
        return
    doc.add(Heading("Excluding degenerate problems"),
            Para("Degenerate problems produce an output that does not depend on the input at the run's "
                 "tolerance, so a constant tensor passes the correctness check. They are marked `(degenerate)` "
                 "below and left out of this table."),
            Table(_SUMMARY_HEADER, [_summary_row(r.label, r.metrics_excluding_degenerate) for r in runs]))
    listed = sorted({(p.problem_id, p.stem) for r in runs for p in r.problems if p.degenerate})
    doc.add(Bullets([f"{pid} {stem}" for pid, stem in listed]))


def _seeds(doc: Document, report: Report) -> None:
    if not report.seed_groups:
        return
    doc.add(Heading("Across seeds"),
            Para("Mean over seeds; intervals from a bootstrap over seeds and problems together."),
            Table(["group", "seeds"] + _SUMMARY_HEADER[1:],
                  [[g.label, ", ".join(map(str, g.seeds))] + _summary_row(g.label, g.metrics)[1:]
                   for g in report.seed_groups]))
    ex = [g for g in report.seed_groups if g.metrics_excluding_degenerate is not None]
    if ex:
        doc.add(Para("Across seeds, excluding degenerate problems:"),
                Table(["group"] + _SUMMARY_HEADER[1:],
                      [_summary_row(g.label, g.metrics_excluding_degenerate) for g in ex]))


def _matched(doc: Document, matched: list[MatchedBudget]) -> None:
    if not matched:
        return
    doc.add(Heading("Matched budgets"),
            Para("Each run read at the same budget per problem: a fraction of the smallest total any compared "
                 "run spent on that axis. Cells: fast_1.0 vs eager / geomean vs eager (1.0x fallback) / correct."))
    for axis in AXES:
        rows = [m for m in matched if m.axis == axis]
        if not rows:
            continue
        labels = [r.label for r in rows[0].rows]
        header = ["run"] + [f"{_num(m.budget)} ({m.fraction:.0%})" for m in rows]
        table = [[label] + [f"{m.rows[i].fast_eager[_P1]:.2f} / {m.rows[i].geomean_eager:.3g}x / "
                            f"{m.rows[i].correct:.2f}" for m in rows] for i, label in enumerate(labels)]
        doc.add(Para(f"Budget axis: {AXES[axis]} ({rows[0].scope} scope)"), Table(header, table))


def _side_by_side(doc: Document, runs: list[RunReport]) -> None:
    if not 2 <= len(runs) <= MAX_SIDE_BY_SIDE:
        return
    order = list(dict.fromkeys(p.problem_id for r in runs for p in r.problems))
    cells = {(r.label, p.problem_id): p for r in runs for p in r.problems}

    def cell(row: ProblemRow | None) -> str:
        if row is None:
            return "-"
        if row.correct and row.speedup_vs_eager:
            return speed_ci(row.speedup_vs_eager, row.speedup_ci.get("eager"))
        return row.status
    doc.add(Heading("Per problem, side by side"), Para("Best speedup vs eager [its 95 % interval over paired rounds, where measured], or the "
                 "furthest status reached."),
            Table(["problem"] + [r.label for r in runs],
                  [[pid] + [cell(cells.get((r.label, pid))) for r in runs] for pid in order]))


def _problem_table(r: RunReport) -> Table:
    rows = []
    for p in r.problems:
        cost = "-" if r.imported else f"${p.spend.cost_usd:.4f}"
        where = f"ep {p.best_episode} turn {p.best_turn}" if p.best_turn is not None else "-"
        name = p.problem_id + (" (degenerate)" if p.degenerate else "")
        best = speed_ci(p.speedup_vs_best, p.speedup_ci.get("best")) + (
            f" ({p.best_baseline})" if p.best_baseline else "")
        rows.append([name, p.stem, p.status, speed_ci(p.speedup_vs_eager, p.speedup_ci.get("eager")),
                     speed_ci(p.speedup_vs_compile, p.speedup_ci.get("compile")),
                     speed_ci(p.speedup_vs_compile_ro, p.speedup_ci.get("compile_ro")), best, fraction(p.sol_fraction), where, str(p.turns),
                     str(p.episodes), cost, "-" if r.imported else _num(p.spend.total_tokens),
                     ", ".join(p.flags) or "-"])
    return Table(["problem", "name", "status", "vs eager", "vs compile", "vs compile_ro", "vs best", "of SOL",
                  "best at", "turns", "episodes", "cost", "tokens", "flags"], rows)


def _tree_blocks(r: RunReport) -> list[Block]:
    """Each problem's search tree: one row per node, indented under the node it continues (with
    no-break spaces: Markdown and HTML drop a cell's leading spaces)."""
    out: list[Block] = []
    for pid, rows in r.trees.items():
        out += [Para(f"Search tree of {pid}: every turn is a node under the turn it continues; "
                     "value is what the UCT score starts from (from the low end of the speedup's interval, "
                     "where it has one); `--fork-at EPISODE:TURN` continues any node."),
                Table(["node", "status", "vs eager", "value", "children"],
                      [[row.prefix.replace(" ", "\u00a0") + row.node + (" (best)" if row.best else ""), row.status,
                        speed_ci(row.speedup_vs_eager, row.speedup_ci), f"{row.value:.2f}", str(row.children)]
                       for row in rows])]
    return out


def _speed_of_light(doc: Document, report: Report) -> None:
    if not report.peaks and not report.unknown_gpus:
        return
    doc.add(Heading("Speed of light"),
            Para("`of SOL` in the per-problem tables: the best kernel's speed-of-light time over its "
                 "runtime, where speed of light = max(FLOPs / peak FLOP/s, bytes / peak bandwidth) per "
                 "forward. FLOPs count matrix products and convolutions only; bytes count each input, "
                 "weight and output once (problems/level3_cost.json), so both are lower bounds. fp32 "
                 "runs use the FP32 CUDA-core peak (TF32 is off under the strict policy), fp16 and bf16 "
                 "runs the dense tensor-core peak."))
    if report.peaks:
        doc.add(Table(["GPU", "reported as", "FP32 TFLOP/s", "TF32 TFLOP/s (dense)",
                       "FP16/BF16 TFLOP/s (dense)", "memory TB/s", "source"],
                      [[p.label, p.device_name, f"{p.fp32_tflops:g}", f"{p.tf32_tflops:g}",
                        f"{p.half_tflops:g}", f"{p.hbm_tb_s:g}", p.source] for p in report.peaks]))
    if report.unknown_gpus:
        doc.add(Para(f"No peaks known for {', '.join(report.unknown_gpus)}: their kernels show `-`."))


def _counts_bullets(c: Counts) -> Bullets:
    return Bullets([f"turn verdicts: {_counts(c.statuses)}", f"flags (all turns): {_counts(c.flags)}",
                    f"flags on best kernels: {_counts(c.flags_in_best)}",
                    f"rejections by rule: {_counts(c.rejections)}",
                    f"rules flagged (not failed): {_counts(c.flagged_rules)}",
                    f"model faults: {_counts(c.faults)}", f"episode stop reasons: {_counts(c.stop_reasons)}"])


def _hardware(doc: Document, runs: list[RunReport]) -> None:
    """Runs judged on several devices: their metrics per device, never pooled across them."""
    items = [(f"{r.label} on {hw}", m) for r in runs for hw, m in r.by_hardware.items()]
    if not items:
        return
    doc.add(Heading("By hardware"),
            Para("Problems judged on different GPU models are compared within their model only: "
                 "each line covers the problems judged on that device (a run's summary above "
                 "pools them)."),
            Table(_SUMMARY_HEADER, [_summary_row(label, m) for label, m in items]),
            Heading("fast_p by hardware", 3), _fast_p_table(items))


def build(report: Report, images: dict[str, str]) -> Document:
    """The document of a report; `images` maps plot names to PNG file names in the report dir."""
    doc = Document("kloop report")
    runs = report.runs
    doc.add(Para(f"Sources: {', '.join(report.sources)}. kloop {report.kloop_version}. "
                 f"Intervals: 95% percentile bootstrap, {report.bootstrap_n} resamples over problems, "
                 f"seed {report.bootstrap_seed}."),
            Para("fast_p: share of ALL problems of the set whose best kernel is correct with speedup strictly "
                 "above p (KernelBench's definition; problems without a record count as failures), against "
                 "PyTorch eager, torch.compile, torch.compile(mode=\"reduce-overhead\") (compile_ro, CUDA "
                 "graphs) and the fastest of those the kernel's evaluation measured (best). A speedup with a "
                 "95 % interval over paired rounds counts only when the interval's low end clears p; one "
                 "without (CPU, records from before paired timing) by its point estimate. Speedups in the "
                 "tables show their interval as [low, high] where they have one. Geomean and median are "
                 "over correct problems only, from point estimates. Best kernel: the first correct one, "
                 "replaced by each later one whose speedup interval lies wholly above the best's (beats it "
                 "beyond the noise); without intervals, the lowest runtime over every episode and turn of "
                 "the run."))
    notes = _notes(report)
    if notes:
        doc.add(Heading("Notes"), Bullets(notes))
    doc.add(Heading("Summary"), Table(_SUMMARY_HEADER, [_summary_row(r.label, r.metrics) for r in runs]),
            Heading("fast_p", 3), _fast_p_table([(r.label, r.metrics) for r in runs]),
            Bullets([f"{r.label}: {r.metrics.fast_sentence(1.0)}" for r in runs]),
            Heading("Spend", 3), _spend_table(runs), Heading("Configuration", 3), _config_table(runs))
    _degenerate(doc, report)
    _seeds(doc, report)
    _matched(doc, report.matched)
    doc.add(Heading("Plots"),
            Image(images["curves_fast"], "best-so-far fast_1.0 and correctness vs budget"),
            Image(images["curves_geomean"], "best-so-far geomean of max(1, speedup vs eager) vs budget"),
            Image(images["fast_p"], "fast_p vs eager, vs torch.compile and vs the fastest baseline"),
            Image(images["speedups"], "distribution of best speedups"))
    _side_by_side(doc, runs)
    _hardware(doc, runs)
    _speed_of_light(doc, report)
    for r in runs:
        doc.add(Heading(f"Run {r.label}"),
                Para(f"`{r.path}`: {r.model}, {r.strategy}, context {r.context}, policy {r.policy}" +
                     (f", axes {r.axes}" if r.axes else "")),
                _problem_table(r), _counts_bullets(r.counts), *_tree_blocks(r))
    return doc
