"""Synthetic run directories written with the real record classes and the real RunStore, and a
fake evaluator (real EvalResult records chosen by markers in the kernel source) for runs that go
through the real loop. Numbers are chosen so the tests can compute metrics by hand."""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from pathlib import Path

from kloop.agent.budget import Spend
from kloop.agent.config import resolve
from kloop.agent.episode import episode_key
from kloop.agent.models.base import Message, ModelReply, Usage
from kloop.agent.records import EpisodeRecord, ModelFaultInfo, TurnRecord
from kloop.agent.store import RunStore
from kloop.evaluator.common.result import (
    CompileLog,
    CorrectnessTrial,
    EnvInfo,
    EvalResult,
    PairedSummary,
    ProfileSummary,
    SpeedupInterval,
    TimingStats,
    Violation,
)
from kloop.evaluator.harness.baselines import best_of
from kloop.problems.registry import Problem, get_problem

T0 = datetime(2026, 1, 1, tzinfo=timezone.utc)
EAGER_MS = 3.0
"""The eager baseline of MarkerEvaluator: a kernel's runtime is EAGER_MS / its speedup."""


def timing(ms: float, comparable: bool = True) -> TimingStats:
    return TimingStats(median_ms=ms, mean_ms=ms, std_ms=0.0, min_ms=ms, max_ms=ms, iqr_ms=0.0, n_trials=10,
                       clock="cuda_event" if comparable else "host", comparable=comparable)


def eval_result(problem: Problem, status: str = "correct", eager: float | None = None,
                compile: float | None = None, runtime_ms: float = 1.0, flags: tuple[str, ...] = (),
                rule: str | None = None, custom_share: float | None = 0.9, comparable: bool = True,
                source: str = "", gpu: str | None = None, compile_ro: float | None = None,
                best_recorded: bool = True,
                ci: dict[str, tuple[float, float]] | None = None) -> EvalResult:
    """A real EvalResult; for `correct`, baselines are derived so the speedups are exactly as given,
    and the best of them is recorded as the evaluator records it (`best_recorded=False`: a result
    from before it was); `ci`: (low, high) of a speedup's 95 % interval over 10 paired rounds, by
    baseline, as paired timing records it."""
    base = dict(evaluator_version="test-1", problem_id=problem.id, problem_sha256=problem.sha256,
                candidate_sha256=hashlib.sha256(source.encode()).hexdigest(), policy="strict",
                device="cuda:0" if comparable else "cpu", backend="triton", started_at=T0.isoformat(),
                flags=list(flags),
                env=EnvInfo(python="3.12", torch="2.9", device_name=gpu) if gpu is not None else None)
    if status == "correct":
        profile = ProfileSummary(activity="cuda", total_ms=runtime_ms, custom_share=custom_share,
                                 text="kernel 90%")
        best = best_of({"eager": eager, "compile": compile, "compile_ro": compile_ro}) if best_recorded \
            else (None, None)
        # A host clock (CPU) gives no speedup, as the evaluator records it: the timings stay.
        speedups = (eager, compile, compile_ro) if comparable else (None, None, None)
        best = best if comparable else (None, None)
        intervals = {b: SpeedupInterval(low=lo, high=hi, level=0.95, rounds=10) for b, (lo, hi) in (ci or {}).items()}
        paired = PairedSummary(rounds=10, calls_per_round=1, handshake_ms=0.01, baselines=list(intervals)) \
            if intervals else None
        return EvalResult(
            speedup_ci=intervals, paired=paired,
            status="correct", stage_reached="done", timing=timing(runtime_ms, comparable),
            eager=timing(runtime_ms * eager, comparable) if eager is not None else None,
            compiled=timing(runtime_ms * compile, comparable) if compile is not None else None,
            compiled_ro=timing(runtime_ms * compile_ro, comparable) if compile_ro is not None else None,
            speedup_vs_eager=speedups[0], speedup_vs_compile=speedups[1],
            speedup_vs_compile_ro=speedups[2],
            best_baseline=best[0], speedup_vs_best=best[1], has_custom_kernel=True, profile=profile,
            correctness=[CorrectnessTrial(trial=0, passed=True)], **base)
    if status == "rejected":
        return EvalResult(status="rejected", stage_reached="static",
                          violations=[Violation(rule=rule or "output_cache", severity="reject",
                                                message="caches outputs across calls")], **base)
    if status == "compile_error":
        return EvalResult(status="compile_error", stage_reached="compile",
                          compile=CompileLog(backend="triton", ok=False), **base)
    return EvalResult(status=status, stage_reached="correctness",
                      correctness=[CorrectnessTrial(trial=0, passed=False)], **base)


@dataclass
class T:
    """One turn to write; turns of the same (problem, episode) are numbered in order."""

    problem: str
    status: str = "correct"
    eager: float | None = None
    compile: float | None = None
    runtime_ms: float = 1.0
    episode: int = 0
    tokens: int = 100
    cost: float = 0.01
    eval_s: float = 1.0
    wall_s: float = 2.0
    flags: tuple[str, ...] = ()
    rule: str | None = None
    fault: bool = False
    """A reply without code (a model fault): no kernel, no evaluation."""
    comparable: bool = True
    gpu: str | None = None
    """The device name the evaluation recorded (`EnvInfo.device_name`); None: no env recorded."""
    compile_ro: float | None = None
    """Speedup vs torch.compile reduce-overhead."""
    best_recorded: bool = True
    """False: a result written before the best baseline was recorded."""
    ci: dict[str, tuple[float, float]] | None = None
    """(low, high) of each speedup's interval over paired rounds, by baseline; None: no paired rounds."""


def write_run(root: Path, problems: list[str], turns: list[T], seed: int = 0,
              eval_fields: dict | None = None, strategy: dict | None = None) -> Path:
    """A finished run directory holding exactly `turns`, one after another in time."""
    cfg = resolve([{"model": {"spec": "scripted:none"}, "problems": problems, "seed": seed,
                    "strategy": strategy or {"turns": 8}, "eval": eval_fields or {},
                    "runs_dir": str(root.parent), "run_id": root.name}])
    store = RunStore.create(root, cfg)
    clock = T0
    numbering: dict[tuple[str, int], int] = {}
    episodes: dict[tuple[str, int], list[TurnRecord]] = {}
    for spec in turns:
        problem = get_problem(spec.problem)
        key = (problem.id, spec.episode)
        turn = numbering[key] = numbering.get(key, 0) + 1
        code = None if spec.fault else f"# {spec.status} {spec.eager}\nclass ModelNew: pass\n"
        reply = ModelReply(text="Here it is." if code is None else f"Here it is.\n```python\n{code}```",
                           usage=Usage(input_tokens=spec.tokens - spec.tokens // 4, output_tokens=spec.tokens // 4),
                           cost_usd=spec.cost, finish_reason="stop", latency_s=1.0, model="fake", raw={})
        finished = clock + timedelta(seconds=spec.wall_s)
        rec = TurnRecord(
            run_id=root.name, episode_key=episode_key(problem.sha256, cfg.digest(), f"sample={spec.episode}"),
            episode=spec.episode, problem_id=problem.id, problem_stem=problem.stem, turn=turn,
            messages=[Message(role="user", content=f"Write a kernel for {problem.stem}.")], reply=reply,
            fault=ModelFaultInfo(type="NoKernelFound", message="no code block") if spec.fault else None,
            code=code, code_sha256=hashlib.sha256(code.encode()).hexdigest() if code else None,
            kernel_path=store.kernel_relpath(problem.stem, spec.episode, turn) if code else None,
            eval=None if spec.fault else eval_result(problem, spec.status, spec.eager, spec.compile,
                                                    spec.runtime_ms, spec.flags, spec.rule,
                                                    comparable=spec.comparable, source=code or "",
                                                    gpu=spec.gpu, compile_ro=spec.compile_ro,
                                                    best_recorded=spec.best_recorded, ci=spec.ci),
            feedback=f"FEEDBACK for turn {turn}: {spec.status}",
            spend=Spend(calls=1, input_tokens=reply.usage.input_tokens, output_tokens=reply.usage.output_tokens,
                        cost_usd=spec.cost, eval_s=spec.eval_s, wall_s=spec.wall_s),
            started_at=clock.isoformat(), finished_at=finished.isoformat())
        store.append_turn(rec)
        episodes.setdefault(key, []).append(rec)
        clock = finished
    for (pid, ep), recs in episodes.items():
        problem = get_problem(pid)
        store.append_episode(EpisodeRecord(
            run_id=root.name, episode_key=recs[0].episode_key, episode=ep, problem_id=pid,
            problem_stem=problem.stem, problem_sha256=problem.sha256, sample=ep, turns=len(recs),
            statuses=[r.status for r in recs], stop_reason="max_turns", stop_detail="done",
            spend=sum((r.spend for r in recs), Spend()), started_at=recs[0].started_at,
            finished_at=recs[-1].finished_at))
    return root


class MarkerEvaluator:
    """Judges a kernel by markers in its source: `# verdict=<status>` (default correct),
    `# speedup=<x>` (vs eager, default 1.0), `# compile=<x>` (vs torch.compile)."""

    def __init__(self) -> None:
        self.calls = 0

    def evaluate(self, problem: Problem, source: str) -> EvalResult:
        self.calls += 1
        status = re.search(r"verdict=(\w+)", source)
        eager = re.search(r"speedup=([0-9.]+)", source)
        comp = re.search(r"compile=([0-9.]+)", source)
        speedup = float(eager.group(1)) if eager else 1.0
        return eval_result(problem, status.group(1) if status else "correct", speedup,
                           float(comp.group(1)) if comp else None, runtime_ms=EAGER_MS / speedup,
                           source=source)


def scripted_reply(marker: str, tokens: int = 100, cost: float = 0.01) -> dict:
    """A scripted-model entry whose kernel carries `marker` and whose usage is known."""
    code = f"import torch\n# {marker}\n\nclass ModelNew(torch.nn.Module):\n    pass\n"
    return {"text": f"My kernel.\n\n```python\n{code}```\n",
            "usage": {"input_tokens": tokens - tokens // 4, "output_tokens": tokens // 4}, "cost_usd": cost}
