"""Per-problem outcomes of a run and the metrics over them, with bootstrap confidence intervals.

Definitions (KernelBench's where it has one):
- A problem's best kernel is `agent.tally.best_turn` over every episode and turn of the run, as
  in `summary.json` and `best/`: a later kernel replaces it only when it beats it beyond the
  noise (without speedup intervals: the lowest median runtime, the earliest among equals).
- fast_p = (problems whose best kernel is correct AND has speedup strictly above p) / (ALL
  problems of the run's set). A problem with no record counts as not correct; a speedup of
  exactly 1.0 is not fast_1.0. fast_0 is the correctness rate: a correct kernel whose speedup
  was not measured (CPU without a baseline) counts for p = 0 only. A speedup with an interval
  over paired rounds (`EvalResult.speedup_ci`) counts only when the interval's low end is above
  p (it clears p beyond the noise); one without (CPU, records from before paired timing) by its
  point estimate (`fast_rule` says which rule a figure used).
- geomean and median speedups are over correct problems with a measured speedup.
- faster_than_compile: among correct problems with a torch.compile speedup, the share above 1.
- Baselines: fast_p and geomeans are kept against eager, torch.compile, torch.compile
  reduce-overhead (`compile_ro`) and the fastest of those a result measured (`best`,
  `evaluator.harness.baselines`); a result from before `best` was recorded gets the smallest of the
  speedups it has, by the same rule.
- Confidence intervals: percentile bootstrap over problems (and, for a group of seeds, over
  seeds and problems), seeded so the same inputs give the same numbers.
"""

from __future__ import annotations

import warnings
from collections import Counter
from collections.abc import Callable

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from kloop.agent.budget import Spend
from kloop.agent.records import TurnRecord
from kloop.agent.report.bound import bound_of
from kloop.agent.report.load import RunData
from kloop.agent.tally import best_turn, host_speedup, total_spend
from kloop.evaluator.common.result import BaselineName, EvalResult, SpeedupInterval
from kloop.evaluator.harness.baselines import best_of

P_VALUES = (0.0, 0.5, 0.8, 1.0, 1.5, 2.0)
_STATUS_ORDER = ("correct", "incorrect", "not_run", "rejected", "timeout", "runtime_error",
                 "compile_error", "unevaluated", "info", "format_error", "missing")
"""How far a problem's furthest kernel got, best first (its status in the per-problem table)."""


class _Record(BaseModel):
    model_config = ConfigDict(extra="forbid")


def turn_status(t: TurnRecord) -> str:
    """The verdict of a turn (`TurnRecord.status`): `unevaluated` for a kernel no evaluator has
    judged (an import); `info` for an agent's step that judged no kernel."""
    return t.status


class ProblemRow(_Record):
    """What one run achieved on one problem."""

    problem_id: str
    stem: str
    degenerate: bool = False
    status: str
    """`correct`, else the furthest status any kernel reached, else `missing` (no turn)."""
    correct: bool = False
    speedup_vs_eager: float | None = None
    speedup_vs_compile: float | None = None
    speedup_vs_compile_ro: float | None = None
    speedup_vs_best: float | None = None
    best_baseline: BaselineName | None = None
    speedup_ci: dict[str, SpeedupInterval] = Field(default_factory=dict)
    """The interval over paired rounds of each speedup that has one, by `VS` name (`best`: the
    interval of the fastest baseline's)."""
    below_clock_resolution: bool = False
    """The best kernel was flagged `below_clock_resolution`: its speedup is dominated by the
    clock's serving overhead."""
    runtime_ms: float | None = None
    comparable: bool | None = None
    """False when the best kernel was timed with a host clock (CPU)."""
    gpu: str | None = None
    """The GPU the best kernel was timed on, as the device reported its name."""
    sol_ms: float | None = None
    """Speed-of-light time of one forward on that GPU (`agent.report.bound`); None where the
    GPU is not in the peaks table, the problem has no committed count for its file, its sizes
    were overridden, or the timing is not a GPU timing."""
    sol_fraction: float | None = None
    """sol_ms / runtime_ms: how close the best kernel came to the bound (1 = at it)."""
    custom_share: float | None = None
    """Share of the best kernel's profiled device time in its own kernels (0 when it has none)."""
    hardware: str | None = None
    """The device the problem's kernels were judged on (its GPU's name, `cpu`); the most common
    one when they were judged on several (a Ray cluster moved the problem). None: never judged."""
    best_episode: int | None = None
    best_turn: int | None = None
    kernel_path: str | None = None
    code_sha256: str | None = None
    flags: list[str] = Field(default_factory=list)
    """Flags of the best kernel."""
    turns: int = 0
    episodes: int = 0
    statuses: dict[str, int] = Field(default_factory=dict)
    spend: Spend = Spend()


def problem_rows(run: RunData) -> list[ProblemRow]:
    """One row per problem of the run's set, in set order."""
    by_problem: dict[str, list[TurnRecord]] = {}
    for t in run.turns:
        by_problem.setdefault(t.problem_id, []).append(t)
    rows = []
    for info in run.problems:
        turns = by_problem.get(info.id, [])
        eps = [e for e in run.episodes if e.problem_id == info.id]
        statuses = Counter(turn_status(t) for t in turns)
        spend = total_spend(turns, eps)
        row = ProblemRow(problem_id=info.id, stem=info.stem, degenerate=info.degenerate,
                         status=min(statuses, key=_STATUS_ORDER.index) if statuses else "missing",
                         turns=len(turns), episodes=len(eps), statuses=dict(statuses), spend=spend)
        devices = Counter(_device_of(t.eval) for t in turns if t.eval is not None)
        if devices:
            row = row.model_copy(update={"hardware": devices.most_common(1)[0][0]})
        best = best_turn(turns)
        if best is not None and best.eval is not None:
            ev = best.eval
            share = None
            if ev.profile is not None:
                share = ev.profile.custom_share if ev.profile.custom_share is not None else 0.0
            row = row.model_copy(update=dict(
                **bound_of(info.cost, ev, run.config.eval.precision)._asdict(), **_speedups(ev),
                correct=True,
                runtime_ms=ev.runtime_ms, comparable=ev.timing.comparable if ev.timing else None,
                custom_share=share, best_episode=best.episode, best_turn=best.turn,
                kernel_path=best.kernel_path, code_sha256=best.code_sha256, flags=list(ev.flags),
                below_clock_resolution=any(f.startswith("below_clock_resolution") for f in ev.flags)))
        rows.append(row)
    return rows


def _speedups(ev: EvalResult) -> dict:
    if (host := host_speedup(ev)) is not None:
        # CPU: the ratio of host-clock times ranks kernels; the row says `comparable=False`
        # and the report labels such numbers as not comparable with GPU ones.
        return dict(speedup_vs_eager=host, speedup_vs_compile=None, speedup_vs_compile_ro=None,
                    best_baseline="eager", speedup_vs_best=host)
    best = (ev.best_baseline, ev.speedup_vs_best)
    if best == (None, None):  # recorded before the best was, or nothing to compare
        best = best_of({"eager": ev.speedup_vs_eager, "compile": ev.speedup_vs_compile,
                        "compile_ro": ev.speedup_vs_compile_ro})
    ci: dict[str, SpeedupInterval] = dict(ev.speedup_ci)
    if best[0] is not None and best[0] in ev.speedup_ci:
        ci["best"] = ev.speedup_ci[best[0]]
    return dict(speedup_vs_eager=ev.speedup_vs_eager, speedup_vs_compile=ev.speedup_vs_compile,
                speedup_vs_compile_ro=ev.speedup_vs_compile_ro, best_baseline=best[0],
                speedup_vs_best=best[1], speedup_ci=ci)


def _device_of(ev: EvalResult) -> str:
    if ev.device == "cpu" or ev.env is None:
        return "cpu"
    return ev.env.device_name


def by_hardware(rows: list[ProblemRow]) -> dict[str, list[ProblemRow]]:
    """Rows grouped by the device their problem was judged on, where there is more than one:
    speedups are ratios to baselines of the same GPU, but which kernels are fast differs by GPU,
    so metrics are kept per model (problems never judged join no group)."""
    groups: dict[str, list[ProblemRow]] = {}
    for r in rows:
        if r.hardware is not None:
            groups.setdefault(r.hardware, []).append(r)
    return groups if len(groups) > 1 else {}


class Counts(_Record):
    """What happened, counted over every turn (statuses, flags, rules) and episode (stops)."""

    statuses: dict[str, int] = Field(default_factory=dict)
    flags: dict[str, int] = Field(default_factory=dict)
    flags_in_best: dict[str, int] = Field(default_factory=dict)
    rejections: dict[str, int] = Field(default_factory=dict)
    """Rules that rejected a kernel (each rejected turn counts each of its rejecting rules)."""
    flagged_rules: dict[str, int] = Field(default_factory=dict)
    """Rules that fired with severity `flag` (kernel not failed)."""
    faults: dict[str, int] = Field(default_factory=dict)
    """Model faults (replies without usable code) by type."""
    stop_reasons: dict[str, int] = Field(default_factory=dict)


def count(run: RunData, rows: list[ProblemRow]) -> Counts:
    statuses, flags, rejections, flagged, faults = Counter(), Counter(), Counter(), Counter(), Counter()
    for t in run.turns:
        statuses[turn_status(t)] += 1
        if t.fault is not None:
            faults[t.fault.type] += 1
        if t.eval is None:
            continue
        flags.update(t.eval.flags)
        for v in t.eval.violations:
            (rejections if v.severity == "reject" else flagged)[v.rule] += 1
        if t.eval.status == "rejected" and not any(v.severity == "reject" for v in t.eval.violations):
            rejections["(no rule recorded)"] += 1
    best_flags = Counter(f for r in rows if r.correct for f in r.flags)
    stops = Counter(e.stop_reason for e in run.episodes)
    srt = lambda c: dict(sorted(c.items(), key=lambda kv: (-kv[1], kv[0])))  # noqa: E731
    return Counts(statuses=srt(statuses), flags=srt(flags), flags_in_best=srt(best_flags),
                  rejections=srt(rejections), flagged_rules=srt(flagged), faults=srt(faults),
                  stop_reasons=srt(stops))


class Estimate(_Record):
    """A point estimate with its bootstrap interval (None where undefined, e.g. nothing correct)."""

    value: float | None
    lo: float | None = None
    hi: float | None = None


VS = ("eager", "compile", "compile_ro", "best")
"""The baselines fast_p is kept against (`best`: the fastest each result measured)."""


class FastP(_Record):
    p: float
    vs_eager: Estimate
    vs_compile: Estimate
    vs_compile_ro: Estimate
    vs_best: Estimate

    def vs(self, baseline: str) -> Estimate:
        return getattr(self, f"vs_{baseline}")


class Metrics(_Record):
    problems: int
    seeds: int = 1
    correct: float
    """Correct problems (for a group of seeds: the mean over seeds)."""
    correctness: Estimate
    fast_p: list[FastP]
    geomean_vs_eager: Estimate
    geomean_vs_compile: Estimate
    geomean_vs_compile_ro: Estimate
    geomean_vs_best: Estimate
    median_vs_eager: Estimate
    median_vs_compile: Estimate
    faster_than_compile: Estimate
    custom_share_mean: float | None = None
    """Mean share of device time in custom kernels over correct best kernels with a profile."""
    no_custom_kernel: int = 0
    """Correct best kernels whose profile shows no custom kernel at all (PyTorch only)."""
    correct_untimed: int = 0
    """Correct best kernels without a speedup vs eager: they count for fast_0 only."""
    correct_no_compile: int = 0
    """Correct best kernels without a torch.compile speedup: fast_p vs compile counts them at p=0 only."""
    correct_no_compile_ro: int = 0
    """Likewise for torch.compile reduce-overhead (not asked for, failed, or before it existed)."""
    host_clock: int = 0
    """Correct best kernels timed with a host clock: their speedups are not GPU numbers."""
    with_interval: int = 0
    """Correct best kernels whose speedup vs eager has an interval over paired rounds: fast_p
    counts them by its low end."""
    point_only: int = 0
    """Correct best kernels with a speedup vs eager but no interval: fast_p counts them by the
    point estimate."""
    interval_level: float | None = None
    """The level of those intervals (0.95); None where there are none."""
    below_clock_resolution: int = 0
    """Correct best kernels flagged `below_clock_resolution`."""
    not_run: int = 0
    unevaluated: int = 0
    missing: int = 0

    def fast(self, p: float, vs: str = "eager") -> float | None:
        return next(f for f in self.fast_p if f.p == p).vs(vs).value

    def fast_rule(self, p: float = 1.0) -> str:
        """Which rule the fast_p figures vs eager used, in words, e.g. `a speedup counts only when its
        95 % interval clears 1.0`."""
        level = f"{round(100 * self.interval_level, 1):g} %" if self.interval_level else ""
        interval = f"a speedup counts only when its {level} interval clears {p:.1f}"
        point = f"its point estimate is above {p:.1f}"
        if not self.with_interval:
            return f"no speedup has an interval over paired rounds: a speedup counts when {point}"
        if not self.point_only:
            return interval
        return f"{interval}; where it has none ({self.point_only} kernel(s)), when {point}"

    def fast_sentence(self, p: float = 1.0) -> str:
        """fast_p vs eager as a count, with its rule beside it: `fast_1.0 vs eager: 3/5 (a
        speedup counts only when its 95 % interval clears 1.0)`."""
        value = self.fast(p)
        figure = "-" if value is None else (f"{round(value * self.problems):d}/{self.problems}"
                                            if self.seeds == 1 else f"{value:.2f}")
        return f"fast_{p:.1f} vs eager: {figure} ({self.fast_rule(p)})"


# -- the statistics, vectorised over (replicates, seeds, problems) -----------------------------
Arrays = dict[str, np.ndarray]
Stat = Callable[[Arrays], np.ndarray]


def _nanmean(x: np.ndarray, axis: int) -> np.ndarray:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        return np.nanmean(x, axis=axis)


def _fast(key: str, p: float) -> Stat:
    def stat(a: Arrays) -> np.ndarray:
        hit = a["correct"] if p == 0 else a["correct"] & (a[f"{key}_low"] > p)
        return hit.mean(axis=-1).mean(axis=-1)
    return stat


def _geomean(key: str) -> Stat:
    def stat(a: Arrays) -> np.ndarray:
        with np.errstate(divide="ignore", invalid="ignore"):
            per_seed = np.exp(_nanmean(np.log(a[key]), axis=-1))
        return _nanmean(per_seed, axis=-1)
    return stat


def _median(key: str) -> Stat:
    def stat(a: Arrays) -> np.ndarray:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            per_seed = np.nanmedian(a[key], axis=-1)
        return _nanmean(per_seed, axis=-1)
    return stat


def _faster_than_compile(a: Arrays) -> np.ndarray:
    known = ~np.isnan(a["compile"])
    with np.errstate(invalid="ignore", divide="ignore"):
        per_seed = (known & (a["compile"] > 1)).sum(axis=-1) / known.sum(axis=-1)
    return _nanmean(per_seed, axis=-1)


def _arrays(table: list[list[ProblemRow]]) -> Arrays:
    def speed(r: ProblemRow, v: float | None) -> float:
        return v if r.correct and v is not None and v > 0 else np.nan
    out = {"correct": np.array([[r.correct for r in rows] for rows in table], dtype=bool).reshape(len(table), -1)}
    for vs in VS:
        out[vs] = np.array([[speed(r, getattr(r, f"speedup_vs_{vs}")) for r in rows] for rows in table],
                           dtype=float).reshape(len(table), -1)
        out[f"{vs}_low"] = np.array([[speed(r, _low(r, vs)) for r in rows] for rows in table],
                                    dtype=float).reshape(len(table), -1)
    return out


def _low(r: ProblemRow, vs: str) -> float | None:
    """What fast_p tests against p: the low end of the speedup's interval, else its point."""
    point = getattr(r, f"speedup_vs_{vs}")
    ci = r.speedup_ci.get(vs)
    return ci.low if ci is not None and point is not None else point


def _estimate(stat: Stat, point: Arrays, boot: Arrays | None) -> Estimate:
    value = float(stat({k: v[None] for k, v in point.items()})[0])
    if np.isnan(value):
        return Estimate(value=None)
    if boot is None:
        return Estimate(value=value)
    reps = stat(boot)
    reps = reps[~np.isnan(reps)]
    if reps.size == 0:
        return Estimate(value=value)
    lo, hi = np.percentile(reps, [2.5, 97.5])
    return Estimate(value=value, lo=float(lo), hi=float(hi))


def _align(runs_rows: list[list[ProblemRow]]) -> list[list[ProblemRow]]:
    """Rows of several seed-runs on the same problem order (a problem one run lacks: missing)."""
    order = list(dict.fromkeys(r.problem_id for rows in runs_rows for r in rows))
    out = []
    for rows in runs_rows:
        by_id = {r.problem_id: r for r in rows}
        out.append([by_id.get(pid) or ProblemRow(problem_id=pid, stem=pid, status="missing") for pid in order])
    return out


def compute_metrics(runs_rows: list[list[ProblemRow]], n_boot: int = 1000, seed: int = 0,
                    exclude_degenerate: bool = False) -> Metrics:
    """Metrics of one run (`[rows]`) or of a group of seed-runs (one row list per seed)."""
    table = _align(runs_rows)
    if exclude_degenerate:
        keep = [i for i, r in enumerate(table[0]) if not any(rows[i].degenerate for rows in table)]
        table = [[rows[i] for i in keep] for rows in table]
    k, n = len(table), len(table[0]) if table else 0
    point = _arrays(table)
    boot = None
    if n_boot > 0 and n > 0:
        rng = np.random.default_rng(seed)
        seed_idx = rng.integers(0, k, size=(n_boot, k)) if k > 1 else np.zeros((n_boot, 1), dtype=int)
        prob_idx = rng.integers(0, n, size=(n_boot, n))
        boot = {key: arr[seed_idx[:, :, None], prob_idx[:, None, :]] for key, arr in point.items()}
    est = lambda stat: _estimate(stat, point, boot) if n else Estimate(value=None)  # noqa: E731
    flat = [r for rows in table for r in rows]
    shares = [r.custom_share for r in flat if r.correct and r.custom_share is not None]
    timed = [r for r in flat if r.correct and r.speedup_vs_eager is not None]
    return Metrics(
        problems=n, seeds=k, correct=sum(r.correct for r in flat) / k if k else 0.0,
        correctness=est(_fast("eager", 0.0)),
        fast_p=[FastP(p=p, **{f"vs_{vs}": est(_fast(vs, p)) for vs in VS}) for p in P_VALUES],
        **{f"geomean_vs_{vs}": est(_geomean(vs)) for vs in VS},
        median_vs_eager=est(_median("eager")), median_vs_compile=est(_median("compile")),
        faster_than_compile=est(_faster_than_compile),
        custom_share_mean=float(np.mean(shares)) if shares else None,
        no_custom_kernel=sum(1 for s in shares if s == 0.0),
        correct_untimed=sum(1 for r in flat if r.correct and r.speedup_vs_eager is None),
        correct_no_compile=sum(1 for r in flat if r.correct and r.speedup_vs_compile is None),
        correct_no_compile_ro=sum(1 for r in flat if r.correct and r.speedup_vs_compile_ro is None),
        host_clock=sum(1 for r in flat if r.correct and r.comparable is False),
        with_interval=sum(1 for r in timed if "eager" in r.speedup_ci),
        point_only=sum(1 for r in timed if "eager" not in r.speedup_ci),
        interval_level=max((r.speedup_ci["eager"].level for r in timed if "eager" in r.speedup_ci),
                           default=None),
        below_clock_resolution=sum(1 for r in flat if r.correct and r.below_clock_resolution),
        not_run=sum(1 for r in flat if r.status == "not_run"),
        unevaluated=sum(1 for r in flat if r.status == "unevaluated"),
        missing=sum(1 for r in flat if r.status == "missing"),
    )
