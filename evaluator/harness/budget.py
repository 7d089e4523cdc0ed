"""How many timed calls each side of the paired rounds gets: the policy's full count, or fewer
for a slow model under a device-time budget (`Policy.timing_budget_ms`).

Why: four sides of 100 paired calls are 1.6 s of device time per correct candidate on L3/1 and
about 34 s on L3/41 (84.6 ms a call) at full size (the H100, 2026-12-05), before the reference
makes each timed call's expected output; the slow models, whose medians are the most stable,
paid the most. A budget caps one side's calls at `budget / eager median`, never below
`timing_min_trials`.

What keeps the count honest and repeatable:
- It is decided before the evaluation's reference stage, from an eager median the trusted
  reference measured at the full count in this process: the baselines' warm-up (`kloop
  baseline`), the kept baseline worker's start (`evaluator.harness.servers`) or an earlier
  evaluation of the problem. Nothing of the candidate's reaches it. With none, the evaluation
  makes the full count and its eager median decides the next ones.
- The first estimate for a problem (per process and `servers.server_key`) stands for the
  process's life, so every candidate of one run of a problem gets the same count.
- Counts come from a short ladder (`ladder`), so a few per cent of noise in the estimate rarely
  moves a problem from one count to another.
- Every call is still timed and checked; the result records the plan (`PairedSummary.plan`)
  and the interval widens where the count is lower.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING

from kloop.evaluator.common.config import Policy
from kloop.evaluator.common.result import PlanSource, TimingPlan, TimingStats

if TYPE_CHECKING:
    from kloop.evaluator.harness.state import EvalRun

LADDER = (1.0, 0.5, 0.3, 0.2)
"""The counts a budget may give, as shares of the full count (100, 50, 30, 20 by default)."""

_ESTIMATES: dict[str, tuple[float, PlanSource]] = {}
"""Problem key -> (eager median in ms, where it came from): the first one stands."""
_LOCK = threading.Lock()


def ladder(full: int, floor: int) -> list[int]:
    """The allowed counts, largest first, none below the floor (nor above the full count)."""
    floor = min(floor, full)
    return sorted({max(floor, round(full * share)) for share in LADDER} | {floor}, reverse=True)


def calls_for(full: int, policy: Policy, eager_ms: float | None) -> int:
    """The largest count on the ladder whose calls fit the budget at `eager_ms` a call (the
    floor when none does; the full count with no budget or no estimate)."""
    budget = policy.timing_budget_ms
    if budget is None or eager_ms is None or eager_ms <= 0:
        return full
    steps = ladder(full, policy.timing_min_trials)
    return next((n for n in steps if n * eager_ms <= budget), steps[-1])


def remember(key: str, eager: TimingStats | None, source: PlanSource) -> None:
    """An eager median measured by trusted code at the full count; the first one stands. The
    median of the calls' wall time before the handshake is taken off (`raw_median_ms`): what a
    call costs the rounds, and never zero where a tiny model's net median is."""
    ms = None if eager is None else eager.raw_median_ms or eager.median_ms
    if ms is None or ms <= 0:
        return
    with _LOCK:
        _ESTIMATES.setdefault(key, (ms, source))


def forget_all() -> None:
    """Drop every estimate (tests; a process that moves to another GPU)."""
    with _LOCK:
        _ESTIMATES.clear()


def plan(run: EvalRun, key: str) -> TimingPlan:
    """This evaluation's count, from the policy and the standing estimate for `key` (the
    problem's `servers.server_key`). On CPU the full count is `EvalConfig.cpu_timing_trials`
    (5), at or under the floor: the budget leaves it as it is unless a config raises it."""
    p = run.policy
    full = run.timing_spec(full=True).trials
    if p.timing_budget_ms is None:
        return TimingPlan(calls=full, full=full)
    with _LOCK:
        known = _ESTIMATES.get(key)
    if known is None:
        return TimingPlan(calls=full, full=full, budget_ms=p.timing_budget_ms,
                          source="unmeasured")
    eager_ms, source = known
    return TimingPlan(calls=calls_for(full, p, eager_ms), full=full,
                      budget_ms=p.timing_budget_ms, eager_ms=eager_ms, source=source)
