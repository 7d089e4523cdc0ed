"""The one definition of "best kernel" and "what was spent", used by the loop, the strategies,
replay and the reports alike (they used to keep a copy each, and the copies drifted)."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import NamedTuple

from kloop.agent.budget import Spend
from kloop.agent.records import BestDecision, CallRecord, EpisodeRecord, TurnRecord, TurnRef
from kloop.evaluator.common.result import BaselineName, EvalResult, HeadToHead, SpeedupInterval

# How far a kernel got, best first: beam search keeps the furthest when none is correct yet.
STATUS_RANK = {"correct": 0, "incorrect": 1, "not_run": 2, "rejected": 3, "timeout": 4,
               "runtime_error": 5, "compile_error": 6, "format_error": 7}


def rank_key(rec: TurnRecord) -> tuple:
    """Sort key of kernels: correct and fastest first, then by how far it got, then earliest."""
    ev = rec.eval
    runtime = ev.runtime_ms if ev is not None and ev.correct and ev.runtime_ms is not None else float("inf")
    return (STATUS_RANK.get(rec.status, 8), runtime, rec.episode, rec.turn)


def host_speedup(ev: EvalResult | None) -> float | None:
    """Eager's host-clock median over the kernel's, for a correct kernel timed on CPU (where the
    evaluator records no speedup): a ratio of CPU times, not comparable with any GPU number, but
    it orders CPU kernels, so the tree search and the reports have something to rank by there.
    None for a GPU result (use its recorded speedups) or without both timings."""
    if ev is None or not ev.correct or ev.timing is None or ev.timing.comparable:
        return None
    if ev.eager is None or ev.timing.median_ms <= 0:
        return None
    return ev.eager.median_ms / ev.timing.median_ms


INTERVAL_BASELINE: BaselineName = "eager"
"""The speedup whose interval ranks kernels: eager is timed in every paired round (a compiled
baseline may fail and be left out), and it is the speedup the tree search values."""


def speedup_interval(ev: EvalResult | None) -> SpeedupInterval | None:
    """The interval of a result's speedup vs eager over the paired rounds, or None (CPU,
    records from before paired timing)."""
    return ev.speedup_ci.get(INTERVAL_BASELINE) if ev is not None else None


def _ref(rec: TurnRecord) -> TurnRef:
    return TurnRef(episode_key=rec.episode_key, turn=rec.turn)


def _eligible(rec: TurnRecord) -> bool:
    return rec.eval is not None and rec.eval.correct and rec.code is not None


def _runtime(rec: TurnRecord) -> float | None:
    return rec.eval.runtime_ms if rec.eval is not None else None


Measure = Callable[[TurnRecord, TurnRecord], "tuple[HeadToHead | None, float, float]"]
"""(incumbent, challenger) -> their head-to-head (None: void), its wall seconds and the seconds
it held the device (`EvalResult.held_s`)."""
"""Times a challenger against the incumbent in the same paired rounds (`evaluator.harness.headtohead`):
the comparison (None: could not be made) and the seconds it took."""


def challenge(incumbent: TurnRecord, challenger: TurnRecord,
              measure: Measure | None = None) -> BestDecision:
    """Whether a correct `challenger` replaces the correct `incumbent` as the best kernel: with
    both intervals, only if it beats it beyond the noise (its low end above the incumbent's high
    end); overlapping intervals go to `settle_close_call`. Without both, the lower median runtime
    wins (the earlier kernel among equals)."""
    a, b = speedup_interval(incumbent.eval), speedup_interval(challenger.eval)
    facts = dict(incumbent=_ref(incumbent), challenger=_ref(challenger),
                 incumbent_runtime_ms=_runtime(incumbent), challenger_runtime_ms=_runtime(challenger))
    if a is not None and b is not None:
        facts |= dict(rule="interval", baseline=INTERVAL_BASELINE, incumbent_interval=a,
                      challenger_interval=b)
        if b.low > a.high:
            return BestDecision(outcome="replaced", detail="replaced: faster beyond the noise", **facts)
        if b.high < a.low:
            return BestDecision(outcome="kept", detail="kept: slower beyond the noise", **facts)
        return settle_close_call(incumbent, challenger, measure)
    ra, rb = facts["incumbent_runtime_ms"], facts["challenger_runtime_ms"]
    faster = rb is not None and (ra is None or rb < ra)
    return BestDecision(outcome="replaced" if faster else "kept", rule="point",
                        detail=f"{'replaced' if faster else 'kept'}: point rule (lower median "
                               "runtime; a side has no speedup interval)", **facts)


def settle_close_call(incumbent: TurnRecord, challenger: TurnRecord,
                      measure: Measure | None = None) -> BestDecision:
    """Decide between two kernels whose speedup intervals overlap: with `measure` (an evaluator
    that times two candidates in the same paired rounds), the head-to-head decides, beyond its
    own noise; without one, or when it is void or still too close, the incumbent stays ("kept:
    too close to call"). The head-to-head and its seconds are kept on the decision; the loop
    charges them to the run's eval and GPU seconds."""
    a, b = speedup_interval(incumbent.eval), speedup_interval(challenger.eval)
    facts = dict(rule="interval", baseline=INTERVAL_BASELINE, incumbent=_ref(incumbent),
                 challenger=_ref(challenger), incumbent_interval=a, challenger_interval=b,
                 incumbent_runtime_ms=_runtime(incumbent),
                 challenger_runtime_ms=_runtime(challenger))
    if measure is None:
        return BestDecision(outcome="kept_too_close", detail="kept: too close to call", **facts)
    h2h, seconds, held = measure(incumbent, challenger)
    facts |= dict(head_to_head=h2h, head_to_head_s=round(seconds, 3),
                  head_to_head_gpu_s=round(held, 3))
    if h2h is not None and h2h.low is not None and h2h.low > 1.0:
        return BestDecision(outcome="replaced", detail=f"replaced: faster head to head "
                            f"({h2h.ratio:.3f}x, interval {h2h.low:.3f}-{h2h.high:.3f})", **facts)
    if h2h is not None and h2h.high is not None and h2h.high < 1.0:
        return BestDecision(outcome="kept", detail=f"kept: slower head to head "
                            f"({h2h.ratio:.3f}x, interval {h2h.low:.3f}-{h2h.high:.3f})", **facts)
    why = "void" if h2h is None or h2h.ratio is None else "too close"
    return BestDecision(outcome="kept_too_close",
                        detail=f"kept: too close to call (head to head {why})", **facts)


def replaces(incumbent: TurnRecord, challenger: TurnRecord) -> bool:
    """Whether `challenger` takes the incumbent's place: its recorded decision where it was
    judged against this very incumbent (a decision is made once), else `challenge`."""
    recorded = challenger.best_decision
    if recorded is not None and recorded.incumbent == _ref(incumbent):
        return recorded.outcome == "replaced"
    return challenge(incumbent, challenger).outcome == "replaced"


def decide(incumbent: TurnRecord | None, challenger: TurnRecord,
           measure: Measure | None = None) -> BestDecision | None:
    """The decision to record on `challenger`'s turn; None where there is nothing to compare
    (it is no correct kernel, or there is no incumbent yet)."""
    if incumbent is None or not _eligible(challenger):
        return None
    return challenge(incumbent, challenger, measure)


def best_turn(turns: Iterable[TurnRecord]) -> TurnRecord | None:
    """The best correct kernel, or None: the first one (in episode and turn order), replaced by
    each later one that beats the best so far (`replaces`). Without speedup intervals this is
    the lowest median runtime, the earliest among equals."""
    best = None
    for t in sorted(filter(_eligible, turns), key=lambda t: (t.episode, t.turn, t.episode_key)):
        if best is None or replaces(best, t):
            best = t
    return best


def best_per_problem(turns: Iterable[TurnRecord]) -> dict[str, TurnRecord]:
    """`best_turn` of each problem that has a correct kernel."""
    by_problem: dict[str, list[TurnRecord]] = {}
    for t in turns:
        by_problem.setdefault(t.problem_id, []).append(t)
    return {pid: b for pid, ts in by_problem.items() if (b := best_turn(ts)) is not None}


def total_spend(turns: Iterable[TurnRecord], episodes: Iterable[EpisodeRecord] = ()) -> Spend:
    """Everything the turns spent, plus calls paid for but never recorded as a turn."""
    spent = sum((t.spend for t in turns), Spend())
    return sum((e.unrecorded_spend for e in episodes), spent)


class Unaccounted(NamedTuple):
    """Calls of an episode that no turn and no episode record accounts for yet."""

    call_ids: list[str]
    spend: Spend


def unaccounted_calls(calls: Iterable[CallRecord], turns: Iterable[TurnRecord],
                      episodes: Iterable[EpisodeRecord]) -> dict[str, Unaccounted]:
    """By episode key, the calls a killed process sent but never recorded a turn for. An
    answered one costs what its reply said; one killed before its answer counts as a call of
    unknown tokens and cost (providers do not bill an unanswered request, and counting it as
    unmetered would make every token limit unenforceable after a crash)."""
    named = {t.call_id for t in turns} | {c for e in episodes for c in e.unrecorded_calls}
    phases: dict[str, dict[str, CallRecord]] = {}
    for c in calls:
        phases.setdefault(c.call_id, {})[c.phase] = c
    out: dict[str, Unaccounted] = {}
    for call_id, seen in phases.items():
        if call_id in named or "failed" in seen or "sent" not in seen:
            continue
        answered = seen.get("answered")
        spend = answered.spend if answered is not None and answered.spend else Spend(calls=1)
        key = seen["sent"].episode_key
        prev = out.get(key, Unaccounted([], Spend()))
        out[key] = Unaccounted([*prev.call_ids, call_id], prev.spend + spend)
    return out
