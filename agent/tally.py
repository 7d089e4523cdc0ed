"""The one definition of "best kernel" and "what was spent", used by the loop, the strategies,
replay and the reports alike (they used to keep a copy each, and the copies drifted)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import NamedTuple

from agent.budget import Spend
from agent.records import CallRecord, EpisodeRecord, TurnRecord
from evaluator.result import EvalResult

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


def best_turn(turns: Iterable[TurnRecord]) -> TurnRecord | None:
    """The correct kernel with the lowest median runtime (the earliest among equals), or None."""
    correct = [t for t in turns if t.eval is not None and t.eval.correct and t.code is not None]
    return min(correct, key=rank_key) if correct else None


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
