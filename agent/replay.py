"""Replay, rescore and fork a recorded run, each into a NEW run directory (the source is never touched).

- replay: the same config and the real loop, with the model replaced by the run's recorded
  replies (`replay:<run-dir>`, no API call); reports every turn whose verdict now differs.
- rescore: every logged kernel evaluated again by the current evaluator (a new GPU, a new
  policy); turns, replies and stop reasons are kept, verdicts and feedback are new.
- fork: each episode's trajectory up to turn N (or the trajectory that led to one node of a search
  tree, `EPISODE:TURN`) becomes the context of a new episode that goes on with another model or
  config.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Literal, NamedTuple

from pydantic import BaseModel, ConfigDict

from kloop.agent.budget import Spend
from kloop.agent.components import build_evaluator, load_problems, with_size
from kloop.agent.config import ConfigError, RunConfig, resolve
from kloop.agent.episode import EpisodeSpec, EpisodeState, feedback_template, feedback_vars
from kloop.agent.models.replay import ReplayModel
from kloop.agent.prompts import PromptSet
from kloop.agent.protocols import Evaluator, Model
from kloop.agent.records import TRAJECTORY_SCHEMA_VERSION, NodeAddress, TurnRecord, utcnow
from kloop.agent.store import RunDirError, RunStore
from kloop.agent.strategies import Runner, executor_report, summarize
from kloop.agent.tally import best_per_problem
from kloop.evaluator.common.result import EvalResult
from kloop.problems.registry import Problem

log = logging.getLogger(__name__)


class TurnDiff(BaseModel):
    model_config = ConfigDict(extra="forbid")

    problem_id: str
    episode: int
    turn: int
    before: str | None
    """Status in the source run (None: the turn did not exist there)."""
    after: str | None
    """Status now (None: the turn was not reached this time)."""


class ReplayReport(BaseModel):
    """Written as `replay_report.json` in the new run directory."""

    model_config = ConfigDict(extra="forbid")

    schema_version: int = TRAJECTORY_SCHEMA_VERSION
    kind: Literal["replay", "rescore"]
    source_run: str
    new_run: str
    turns_compared: int
    differences: list[TurnDiff]
    replies_unused: int | None = None
    """Replay: recorded replies no query matched (the trajectory took another path)."""
    first_judged: int = 0
    """Rescore: kernels the source never judged (an import): judged now for the first time, so
    they have no verdict to differ from."""


class TurnDiffs(NamedTuple):
    compared: int
    differences: list[TurnDiff]
    first_judged: int


def diff_turns(old: list[TurnRecord], new: list[TurnRecord]) -> TurnDiffs:
    """Turns matched by (problem, episode, turn) whose status differs, or that exist on one side
    only; a kernel the source never judged (`unevaluated`) is counted apart, not as a change."""
    before = {(t.problem_id, t.episode, t.turn): t.status for t in old}
    after = {(t.problem_id, t.episode, t.turn): t.status for t in new}
    keys = sorted(before.keys() | after.keys())
    diffs = [TurnDiff(problem_id=k[0], episode=k[1], turn=k[2], before=before.get(k), after=after.get(k))
             for k in keys if before.get(k) != after.get(k) and before.get(k) != "unevaluated"]
    first = sum(1 for k in keys if before.get(k) == "unevaluated" and after.get(k) is not None)
    return TurnDiffs(len(keys), diffs, first)


def derived_config(source: RunStore, out: Path, layers: list[dict]) -> RunConfig:
    """The source run's config with `layers` merged over it, stored at `out`."""
    base = source.config_record().config.model_dump(mode="json", exclude_none=False)
    cfg = resolve([base, *layers, {"runs_dir": str(out.parent), "run_id": out.name}])
    return cfg


def replay(source_dir: Path, out: Path, evaluator: Evaluator | None = None,
           eval_overrides: dict | None = None,
           on_turn: Callable[[TurnRecord], None] | None = None,
           executor: dict | None = None) -> ReplayReport:
    """Re-drive the loop with the recorded replies; report turns whose verdict changed."""
    source = RunStore.open(source_dir)
    if source.config_record().kind == "fork":
        raise RunDirError(f"{source_dir} is a fork: its episodes start inside another run; "
                          "replay that run, or rescore this one")
    # One episode at a time, so identical prompts (first turns of samples) get their replies in
    # recorded order.
    layer = {"model": {"spec": f"replay:{source_dir}"}, "concurrency": 1}
    cfg = derived_config(source, out, [layer, {"eval": eval_overrides or {}},
                                       {"executor": executor or {}}])
    problems = load_problems(cfg)
    model = ReplayModel.from_run(source_dir)
    evaluator = evaluator or build_evaluator(cfg, problems)
    store = RunStore.create(out, cfg, kind="replay", source_run=str(source_dir))
    Runner(cfg, store, model, evaluator, on_turn=on_turn).run(problems)
    compared, diffs, _ = diff_turns(source.turns(), store.turns())
    report = ReplayReport(kind="replay", source_run=str(source_dir), new_run=str(out),
                          turns_compared=compared, differences=diffs, replies_unused=model.remaining)
    (out / "replay_report.json").write_text(report.model_dump_json(indent=2) + "\n")
    return report


@contextlib.contextmanager
def _threads(evaluator: Evaluator, concurrency: int) -> Iterator[Callable[
        [Problem, str], Future[tuple[EvalResult, float]]]]:
    """An evaluator with no queue of its own (a Ray pool): `concurrency` threads calling it."""
    def judged(problem: Problem, code: str) -> tuple[EvalResult, float]:
        start = time.monotonic()
        return evaluator.evaluate(problem, code), time.monotonic() - start

    with ThreadPoolExecutor(max_workers=concurrency) as pool:
        yield lambda problem, code: pool.submit(judged, problem, code)


RESCORE_KEYS = {"eval", "problem_overrides"}
"""What `-c` may change in a rescore: how kernels are judged, and at which sizes (the replies,
the strategy and the model are the source's)."""


def rescore(source_dir: Path, out: Path, evaluator: Evaluator | None = None,
            eval_overrides: dict | None = None,
            on_turn: Callable[[TurnRecord], None] | None = None,
            concurrency: int | None = None, executor: dict | None = None,
            layers: list[dict] | None = None, size: str | None = None) -> ReplayReport:
    """Evaluate every logged kernel again into a new run; replies and stop reasons are kept.
    `concurrency` evaluations run at once (default: the source run's setting); `executor`
    (`{"kind": "ray", ...}`) judges them elsewhere (an imported KernelBench folder too).
    `layers` (`-c`) change `eval.*` and `problem_overrides` only; `size="small"` shrinks every
    problem under the sizes the source was judged at (an import keeps its exported sizes)."""
    for layer in layers or []:
        if extra := sorted(set(layer) - RESCORE_KEYS):
            raise ConfigError(f"--rescore -c sets only eval.* and problem_overrides, not {', '.join(extra)}")
    source = RunStore.open(source_dir)
    cfg = derived_config(source, out, [*(layers or []), {"eval": eval_overrides or {}},
                                       {"executor": executor or {}}])
    cfg = with_size(cfg, size) if size is not None else cfg
    problems = {p.id: p for p in load_problems(cfg)}
    evaluator = evaluator or build_evaluator(cfg, list(problems.values()))
    store = RunStore.create(out, cfg, kind="rescore", source_run=str(source_dir))
    prompts = PromptSet(cfg.agent.prompts_dir)
    old_turns = sorted(source.turns(), key=lambda t: (t.problem_id, t.episode, t.turn))
    runner_turns: dict[str, list[TurnRecord]] = {}
    states: dict[str, EpisodeState] = {}

    # `concurrency` evaluations at once (process starts and builds overlap; the evaluator's
    # device lock still times one at a time), recorded in the source's order as they finish.
    batch = getattr(evaluator, "batch", None) or functools.partial(_threads, evaluator)
    with batch(concurrency or cfg.concurrency) as submit:
        results = [submit(problems[old.problem_id], old.code) if old.code is not None else None
                   for old in old_turns]
        for old, future in zip(old_turns, results, strict=True):
            problem = problems[old.problem_id]
            spec = EpisodeSpec(problem=problem, key=old.episode_key, episode=old.episode,
                               sample=0, max_turns=cfg.strategy.turns)
            state = states.setdefault(old.episode_key, EpisodeState(spec))
            rec = old.model_copy(deep=True, update={"run_id": store.run_id})
            # A rescore calls no model: its spend is the evaluation alone (the recorded reply,
            # with its usage, stays on the turn for reference).
            rec.spend = Spend()
            if future is not None:
                rec.eval, seconds = future.result()
                rec.spend = Spend(eval_s=seconds,
                                  gpu_s=rec.eval.held_s if rec.eval is not None else 0.0)
            rec.feedback = prompts.render(feedback_template(rec.eval),
                                          **feedback_vars(state, rec.eval, rec.fault, cfg.agent))
            rec.best_decision = state.decide(rec)
            store.append_turn(rec)
            state.add(rec)
            runner_turns.setdefault(rec.episode_key, []).append(rec)
            if on_turn is not None:
                on_turn(rec)
    records = []
    latest = {e.episode_key: e for e in source.episodes()}
    for key, ep in latest.items():
        state = states.get(key)
        new = ep.model_copy(update={
            "run_id": store.run_id, "best": state.best if state else None,
            "statuses": [t.status for t in state.own] if state else [],
            "spend": state.spend if state else Spend(), "unrecorded_spend": Spend(),
            "finished_at": utcnow()})
        store.append_episode(new)
        records.append(new)
    best = best_per_problem(t for ts in runner_turns.values() for t in ts)
    for rec in best.values():
        store.write_best(rec.problem_stem, rec.code or "")
    store.write_summary(summarize(store.run_id, runner_turns, records, best, "finished",
                                  executor=executor_report(evaluator)))
    compared, diffs, first = diff_turns(old_turns, store.turns())
    report = ReplayReport(kind="rescore", source_run=str(source_dir), new_run=str(out),
                          turns_compared=compared, differences=diffs, first_judged=first)
    (out / "replay_report.json").write_text(report.model_dump_json(indent=2) + "\n")
    return report


def fork(source_dir: Path, out: Path, at_turn: int | NodeAddress, layers: list[dict],
         model: Model | None = None, evaluator: Evaluator | None = None,
         on_turn: Callable[[TurnRecord], None] | None = None) -> Runner:
    """Continue every episode of a run after its turn `at_turn` (or, given a node address, that
    node of each problem's search tree) with another model or config."""
    from kloop.agent.components import build_model

    source = RunStore.open(source_dir)
    cfg = derived_config(source, out, layers)
    problems = load_problems(cfg)
    # Everything that can fail on the user's input (API key, evaluator config) before the run dir.
    model = model or build_model(cfg)
    evaluator = evaluator or build_evaluator(cfg, problems)
    store = RunStore.create(out, cfg, kind="fork", source_run=str(source_dir), fork_at=at_turn)
    runner = Runner(cfg, store, model, evaluator, on_turn=on_turn)
    runner.run(problems, fork=(source, at_turn))
    return runner
