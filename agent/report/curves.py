"""Budget curves: best-so-far fast_p and geomean speedup as functions of what was spent.

The x axes are matched units: turns, LLM calls, tokens (input + output), dollars, eval seconds (GPU-seconds on a GPU)
(evaluation seconds) and wall-clock seconds. Turns are replayed in the order they finished.

Two scopes:
- `problem` (default): x is the budget *per problem*; at budget b each problem counts the best
  kernel it had found once it had spent b (its own turns, in their order). This is the unit of
  KernelBench's and Kevin's turns-vs-samples comparisons, independent of scheduling.
- `run`: x is what the whole run had spent when each turn finished (wall-clock: elapsed time
  since the run's first turn started, so parallel episodes overlap).

At each point: fast_p (vs eager and vs torch.compile) over ALL problems of the set, and the
geomean over all problems of each problem's best speedup so far, where a problem with no
correct kernel, or only slower ones, counts 1.0x (the user keeps PyTorch): this makes the
curve monotone. The summary's geomean over correct problems is in the metrics, not here. As in
the metrics, fast_p tests the low end of a speedup's interval over paired rounds where it has
one (the best low end so far), else its point estimate.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import datetime
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from kloop.agent.budget import Spend
from kloop.agent.report.load import RunData
from kloop.agent.report.metrics import P_VALUES
from kloop.agent.tally import host_speedup
from kloop.evaluator.common.result import BaselineName, EvalResult

Scope = Literal["problem", "run"]
AXES: dict[str, str] = {
    "turns": "turns",
    "calls": "LLM calls",
    "tokens": "tokens (in + out)",
    "dollars": "USD",
    "eval_s": "eval seconds",
    "gpu_s": "GPU-seconds (device held)",
    "wall_s": "wall-clock seconds",
}
_COUNTED = {"turns", "calls"}


class _Record(BaseModel):
    model_config = ConfigDict(extra="forbid")


class CurvePoint(_Record):
    x: float
    correct: float
    """fast_0: share of all problems with a correct kernel so far."""
    fast_eager: list[float]
    """fast_p vs eager for p in P_VALUES."""
    fast_compile: list[float]
    geomean_eager: float
    """Geomean over all problems of max(1, best speedup so far vs eager)."""
    geomean_compile: float


class Curve(_Record):
    label: str
    axis: str
    scope: Scope
    available: bool = True
    note: str | None = None
    """Why the axis is unavailable (cost unknown, imported records without usage)."""
    points: list[CurvePoint] = Field(default_factory=list)

    @property
    def total(self) -> float:
        return self.points[-1].x if self.points else 0.0

    def at(self, budget: float) -> CurvePoint | None:
        """The point in force at `budget` (the last one with x <= budget)."""
        hit = None
        for p in self.points:
            if p.x > budget + 1e-12 * max(1.0, abs(budget)):
                break
            hit = p
        return hit


def _amount(axis: str, spend: Spend, turns: int) -> float:
    return {"turns": float(turns), "calls": float(spend.calls), "tokens": float(spend.total_tokens),
            "dollars": spend.cost_usd, "eval_s": spend.eval_s, "gpu_s": spend.gpu_s,
            "wall_s": spend.wall_s}[axis]


@dataclass
class _Event:
    when: str
    problem: str
    spend: Spend
    turns: int
    correct: bool = False
    eager: float | None = None
    compile: float | None = None
    eager_low: float | None = None
    """What fast_p tests: the low end of the speedup's interval, else the speedup itself."""
    compile_low: float | None = None


def _low(ev: EvalResult, baseline: BaselineName, point: float | None) -> float | None:
    ci = ev.speedup_ci.get(baseline)
    return ci.low if ci is not None and point is not None else point


def _events(run: RunData) -> list[_Event]:
    out = []
    for t in run.turns:
        ev = t.eval
        ok = ev is not None and ev.correct
        host = host_speedup(ev)
        eager = host if host is not None else ev.speedup_vs_eager if ok else None
        compile = ev.speedup_vs_compile if ok else None
        lows = (_low(ev, "eager", eager), _low(ev, "compile", compile)) if ok else (None, None)
        out.append(_Event(t.finished_at, t.problem_id, t.spend, 1, ok, eager, compile, *lows))
    for e in run.episodes:
        if e.unrecorded_spend != Spend():
            out.append(_Event(e.finished_at, e.problem_id, e.unrecorded_spend, 0))
    return sorted(out, key=lambda e: (e.when, e.problem))


def _unavailable(run: RunData, axis: str) -> str | None:
    if axis in ("tokens", "dollars") and run.imported:
        return "imported records carry no token usage or cost"
    if axis == "tokens":
        unmetered = sum(t.spend.unmetered_calls for t in run.turns)
        if unmetered:
            return f"{unmetered} call(s) of unknown token usage"
    if axis == "dollars":
        unpriced = sum(t.spend.unpriced_calls for t in run.turns)
        if unpriced:
            return f"{unpriced} call(s) of unknown cost (model not in the price table)"
    return None


class _Tally:
    """Per-problem best so far, and the aggregates over all problems, updated in O(1)."""

    def __init__(self, problems: list[str]):
        self.n = len(problems)
        self.state = {p: (False, 1.0, 1.0, 1.0, 1.0) for p in problems}
        self.correct = 0
        self.fast_e = [0] * len(P_VALUES)
        self.fast_c = [0] * len(P_VALUES)
        self.log_e = 0.0
        self.log_c = 0.0

    def _apply(self, state: tuple[bool, float, float, float, float], sign: int) -> None:
        ok, e, c, e_low, c_low = state
        self.correct += sign * ok
        for i, p in enumerate(P_VALUES):
            self.fast_e[i] += sign * (ok and (p == 0 or e_low > p))
            self.fast_c[i] += sign * (ok and (p == 0 or c_low > p))
        self.log_e += sign * math.log(max(1.0, e))
        self.log_c += sign * math.log(max(1.0, c))

    def update(self, ev: _Event) -> None:
        if ev.problem not in self.state or not ev.correct:
            return
        old = self.state[ev.problem]
        ok = old[0]

        def best(held: float, seen: float | None) -> float:
            # Best so far: a speedup never measured stays "unknown" (nan compares False for p > 0).
            top = max(held if ok and not math.isnan(held) else -math.inf,
                      seen if seen is not None else -math.inf)
            return top if top > -math.inf else math.nan
        new = (True, *(best(h, s) for h, s in zip(old[1:], (ev.eager, ev.compile, ev.eager_low,
                                                              ev.compile_low), strict=True)))
        if new == old:
            return
        self._apply(old, -1)
        self._apply(new, +1)
        self.state[ev.problem] = new

    def point(self, x: float) -> CurvePoint:
        n = max(self.n, 1)
        return CurvePoint(x=x, correct=self.correct / n, fast_eager=[v / n for v in self.fast_e],
                          fast_compile=[v / n for v in self.fast_c],
                          geomean_eager=math.exp(self.log_e / n), geomean_compile=math.exp(self.log_c / n))


def _with_x(run: RunData, events: list[_Event], axis: str, scope: Scope) -> list[tuple[float, _Event]]:
    """Each event with the cumulative budget at which it happened, sorted by that budget."""
    out = []
    if scope == "run" and axis == "wall_s":
        starts = [datetime.fromisoformat(t.started_at) for t in run.turns]
        start = min(starts) if starts else None
        for ev in events:
            out.append((max(0.0, (datetime.fromisoformat(ev.when) - start).total_seconds()) if start else 0.0, ev))
        return out
    totals: dict[str, float] = {}
    for ev in events:
        key = ev.problem if scope == "problem" else ""
        totals[key] = totals.get(key, 0.0) + _amount(axis, ev.spend, ev.turns)
        out.append((totals[key], ev))
    return sorted(out, key=lambda xe: xe[0])


def curve(run: RunData, axis: str, scope: Scope = "problem", events: list[_Event] | None = None) -> Curve:
    """The best-so-far curve of one run along one axis."""
    if axis not in AXES:
        raise ValueError(f"unknown budget axis {axis!r}; axes: {', '.join(AXES)}")
    note = _unavailable(run, axis)
    if note is not None:
        return Curve(label=run.label, axis=axis, scope=scope, available=False, note=note)
    tally = _Tally([p.id for p in run.problems])
    points = [tally.point(0.0)]
    placed = _with_x(run, events if events is not None else _events(run), axis, scope)
    for i, (x, ev) in enumerate(placed):
        tally.update(ev)
        last_at_x = i + 1 == len(placed) or placed[i + 1][0] > x
        if not last_at_x:
            continue
        pt = tally.point(x)
        if pt.model_dump(exclude={"x"}) != points[-1].model_dump(exclude={"x"}) or i + 1 == len(placed):
            if points[-1].x == x:
                points[-1] = pt
            else:
                points.append(pt)
    return Curve(label=run.label, axis=axis, scope=scope, points=points)


def run_curves(run: RunData, scope: Scope = "problem") -> list[Curve]:
    events = _events(run)
    return [curve(run, axis, scope, events) for axis in AXES]


class MatchedRow(_Record):
    label: str
    total: float
    """What this run spent in all (per problem at most, for the problem scope)."""
    correct: float
    fast_eager: list[float]
    fast_compile: list[float]
    geomean_eager: float


class MatchedBudget(_Record):
    """Every run's curve read at the same budget."""

    axis: str
    scope: Scope
    budget: float
    fraction: float
    """`budget` as a fraction of the smallest total any compared run spent on this axis."""
    rows: list[MatchedRow]


def matched_budgets(curves: list[Curve], fractions: tuple[float, ...] = (0.25, 0.5, 1.0)) -> list[MatchedBudget]:
    """For each axis on which two or more runs are available: all runs at equal budgets."""
    out = []
    for axis in AXES:
        usable = [c for c in curves if c.axis == axis and c.available and c.total > 0]
        if len(usable) < 2:
            continue
        common = min(c.total for c in usable)
        budgets = {f: common * f for f in fractions}
        if axis in _COUNTED:  # a fraction of a turn or call is no budget anyone can spend
            budgets = {f: float(math.floor(b)) for f, b in budgets.items() if b >= 1}
            budgets = {b / common: b for b in sorted(set(budgets.values()))}
        for f, budget in budgets.items():
            rows = []
            for c in usable:
                pt = c.at(budget)
                assert pt is not None  # every curve starts at x = 0
                rows.append(MatchedRow(label=c.label, total=c.total, correct=pt.correct,
                                       fast_eager=pt.fast_eager, fast_compile=pt.fast_compile,
                                       geomean_eager=pt.geomean_eager))
            out.append(MatchedBudget(axis=axis, scope=usable[0].scope, budget=budget, fraction=f, rows=rows))
    return out
