"""Search strategies over one budget meter, and the runner that executes their episodes.

- sequential (1×T), best_of_n (N×1) and grid (N×T): N independent episodes of T turns;
- beam: round 0 runs k×m episodes from scratch; each later round keeps the k best kernels seen
  so far and starts m children from each, with the parent's trajectory as their context.
- agent: `samples` episodes of a tool-using agent (agent/agentic.py) of `turns` steps each.
- tree: `roots` episodes from scratch, then `expansions` more, one step at a time, each from
  the node of the problem's search tree (agent/tree.py) with the highest UCT score. Every pick
  is a function of the turns on disk, so a resumed run makes the same picks and finds their
  episodes finished (or continues the one that was cut off).

Every episode has a key, sha256(problem hash, config digest, its place in the strategy), so a
resumed run skips finished episodes and continues cut-off ones from their last turn on disk.
"""

from __future__ import annotations

import functools
import logging
import threading
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime

from kloop.agent.agentic import Facts, run_agent_episode
from kloop.agent.budget import Meter, Spend
from kloop.agent.config import RunConfig
from kloop.agent.episode import EpisodeEnv, EpisodeSpec, best_of, episode_key
from kloop.agent.loop import run_episode
from kloop.agent.prompts import PromptSet
from kloop.agent.protocols import Evaluator, Model
from kloop.agent.records import (
    CallRecord,
    EpisodeRecord,
    ExecutorReport,
    NodeAddress,
    ProblemSummary,
    RunSummary,
    TurnRecord,
    TurnRef,
    utcnow,
)
from kloop.agent.store import RunStore
from kloop.agent.tally import Unaccounted, best_turn, rank_key, total_spend, unaccounted_calls
from kloop.agent.tree import Tree
from kloop.problems.registry import Problem

log = logging.getLogger(__name__)

class Runner:
    """Runs a config's strategy over its problems into one run store; resumes from what is there."""

    def __init__(self, cfg: RunConfig, store: RunStore, model: Model, evaluator: Evaluator,
                 on_turn: Callable[[TurnRecord], None] | None = None,
                 on_episode: Callable[[EpisodeRecord], None] | None = None):
        self.cfg, self.store = cfg, store
        self.digest = cfg.digest()
        self.on_turn_cb, self.on_episode_cb = on_turn, on_episode
        self._lock = threading.Lock()
        self.turns: dict[str, list[TurnRecord]] = {}
        self.finished: dict[str, EpisodeRecord] = {}
        self.records: list[EpisodeRecord] = []
        self.best: dict[str, TurnRecord] = {}
        self._by_problem: dict[str, list[TurnRecord]] = {}
        self.skipped = 0
        self._prefixes: dict[str, list[TurnRecord]] = {}
        """Each started episode's inherited context, so its turns can parent a beam child."""
        self._beam_kept: dict[str, list[TurnRecord]] = {}
        # One bound on episodes in flight for the whole run: problems and the episodes of each
        # problem both get threads, and without it the two pools multiply (concurrency squared).
        self.concurrency = cfg.concurrency
        if getattr(model, "ordered", False) and cfg.concurrency > 1:
            # Ordered scripted replies go to queries in the order they come: parallel episodes
            # would take each other's (a problem given another problem's kernel).
            log.warning("%s gives its replies in query order: episodes run one at a time "
                        "(address the replies with `at:` to run them in parallel)", model.name)
            self.concurrency = 1
        self._slots = threading.BoundedSemaphore(self.concurrency)
        self._load_existing()
        restore_position(model, self.store.turns(), self.store.calls())
        self._episode = run_episode
        if cfg.strategy.kind == "agent":
            self._episode = functools.partial(
                run_agent_episode, facts=Facts(eval=cfg.eval, overrides=cfg.problem_overrides))
        self.run_meter = Meter(cfg.budget.run, "run", spent=self._spent_so_far())
        self.env = EpisodeEnv(
            run_id=store.run_id, model=model, evaluator=evaluator, agent=cfg.agent,
            limits=cfg.budget.episode, run_meter=self.run_meter, sink=store,
            prompts=PromptSet(cfg.agent.prompts_dir), comparison=cfg.eval.comparison(),
            base_overrides=cfg.eval.problem_overrides, problem_overrides=cfg.problem_overrides,
            on_turn=self._on_turn,
        )

    # -- state from disk ----------------------------------------------------------------------
    def _load_existing(self) -> None:
        for rec in self.store.turns():
            self.turns.setdefault(rec.episode_key, []).append(rec)
            self._by_problem.setdefault(rec.problem_id, []).append(rec)
        self.best = {pid: b for pid, ts in self._by_problem.items() if (b := best_turn(ts)) is not None}
        for ep in self.store.episodes():
            self.records.append(ep)
            if ep.stop_reason == "infra_error":
                self.finished.pop(ep.episode_key, None)  # to be continued
            else:
                self.finished[ep.episode_key] = ep
        self.unaccounted = unaccounted_calls(
            self.store.calls(), [t for ts in self.turns.values() for t in ts], self.records)
        """Calls a killed process paid for but never recorded a turn for, by episode key."""

    def _spent_so_far(self) -> Spend:
        turns = [t for ts in self.turns.values() for t in ts]
        latest = {r.episode_key: r for r in self.records}.values()  # as `summarize` counts
        spent = sum((u.spend for u in self.unaccounted.values()), total_spend(turns, latest))
        if turns:  # episodes overlap in time: the wall clock is the span, not the sum
            first = min(datetime.fromisoformat(t.started_at) for t in turns)
            last = max(datetime.fromisoformat(t.finished_at) for t in turns)
            spent = spent.model_copy(update={"wall_s": (last - first).total_seconds()})
        return spent

    def _note_best(self, rec: TurnRecord) -> None:
        # Over all of the problem's turns, not the best so far and `rec`: the rule keeps the
        # incumbent on a close call, so the best depends on the order kernels are compared in,
        # and episodes running side by side finish out of that order (`agent.tally.best_turn`).
        self._by_problem.setdefault(rec.problem_id, []).append(rec)
        current = self.best.get(rec.problem_id)
        best = best_turn(self._by_problem[rec.problem_id])
        if best is None or best is current:
            return
        self.best[rec.problem_id] = best
        if best.code is not None:
            self.store.write_best(best.problem_stem, best.code)

    def _on_turn(self, rec: TurnRecord) -> None:
        with self._lock:
            self.turns.setdefault(rec.episode_key, []).append(rec)
            self._note_best(rec)
        if self.on_turn_cb is not None:
            self.on_turn_cb(rec)

    # -- episodes -------------------------------------------------------------------------------
    def spec(self, problem: Problem, episode: int, lineage: str, *, sample: int = 0,
             round_: int = 0, parent: TurnRecord | None = None) -> EpisodeSpec:
        prefix: list[TurnRecord] = []
        if parent is not None:
            inherited = self._prefixes.get(parent.episode_key, [])
            prefix = inherited + self.turns[parent.episode_key][: parent.turn]
        return EpisodeSpec(
            problem=problem, key=episode_key(problem.sha256, self.digest, lineage),
            episode=episode, sample=sample, max_turns=self.cfg.strategy.turns, round=round_,
            parent=TurnRef(episode_key=parent.episode_key, turn=parent.turn) if parent else None,
            prefix=prefix,
        )

    def run_one(self, spec: EpisodeSpec) -> EpisodeRecord | None:
        """Run an episode unless it is finished already or the run budget is spent (then None)."""
        with self._lock:
            self._prefixes[spec.key] = spec.prefix
            if spec.key in self.finished:
                return self.finished[spec.key]
            done = list(self.turns.get(spec.key, []))
            carried = self._carried(spec.key)
        with self._slots:
            if not done and self.run_meter.exceeded() is not None:
                self.skipped += 1
                return None
            record = self._episode(spec, self.env, done, carried)
        self.store.append_episode(record)
        with self._lock:
            self.records.append(record)
            if record.stop_reason != "infra_error":
                self.finished[spec.key] = record
        self.write_summary("running")
        if self.on_episode_cb is not None:
            self.on_episode_cb(record)
        return record

    def _carried(self, key: str) -> Unaccounted | None:
        """What a continued episode's record must account for besides its turns: calls of a
        killed process, and the unrecorded spend of the record it supersedes (an infra error),
        since the summary counts only the latest record of each episode."""
        orphans = self.unaccounted.pop(key, None)
        before = next((r for r in reversed(self.records) if r.episode_key == key), None)
        if before is None or before.unrecorded_spend == Spend() and not before.unrecorded_calls:
            return orphans
        orphans = orphans or Unaccounted([], Spend())
        return Unaccounted([*before.unrecorded_calls, *orphans.call_ids],
                           before.unrecorded_spend + orphans.spend)

    def run_wave(self, specs: list[EpisodeSpec]) -> list[EpisodeRecord | None]:
        if self.concurrency == 1 or len(specs) == 1:
            return [self.run_one(s) for s in specs]
        with ThreadPoolExecutor(self.concurrency, thread_name_prefix="episode") as pool:
            return list(pool.map(self.run_one, specs))

    # -- strategies -----------------------------------------------------------------------------
    def run_problem(self, problem: Problem) -> None:
        strategy = self.cfg.strategy
        if strategy.kind == "beam":
            self._beam(problem)
            return
        if strategy.kind == "tree":
            self._tree(problem)
            return
        self.run_wave([self.spec(problem, i, f"sample={i}", sample=i) for i in range(strategy.samples)])

    def _beam(self, problem: Problem) -> None:
        s = self.cfg.strategy
        width = s.beam_width * s.expand
        specs = [self.spec(problem, j, f"beam:r0:c{j}", sample=j) for j in range(width)]
        episode = width
        for round_ in range(1, s.rounds + 1):
            self.run_wave(specs)
            if round_ == s.rounds:
                break
            pool = [t for sp in specs for t in self.turns.get(sp.key, []) if t.code is not None]
            pool = sorted(pool + self._beam_kept.get(problem.id, []), key=rank_key)
            kept = list({(t.episode_key, t.turn): t for t in pool}.values())[: s.beam_width]
            self._beam_kept[problem.id] = kept
            if not kept:
                log.warning("%s: beam round %d produced no kernel; stopping the search", problem.id, round_)
                return
            specs = []
            for parent in kept:
                for child in range(s.expand):
                    lineage = f"beam:r{round_}:{parent.episode_key}:{parent.turn}:c{child}"
                    specs.append(self.spec(problem, episode, lineage, sample=child, round_=round_,
                                           parent=parent))
                    episode += 1

    def _tree(self, problem: Problem) -> None:
        s = self.cfg.strategy
        specs = [self.spec(problem, j, f"tree:root:{j}", sample=j) for j in range(s.roots)]
        keys = [sp.key for sp in specs]
        episode, step, total = s.roots, 1, s.roots + s.expansions
        results = self.run_wave(specs)
        # A step whose episodes were all skipped means the run budget is spent.
        while episode < total and any(r is not None for r in results):
            # Only the episodes of the steps so far: a resumed run has later ones on disk already.
            tree = Tree([t for k in keys for t in self.turns.get(k, [])])
            specs = []
            picks = tree.select(s.exploration, s.max_children, min(s.batch, total - episode))
            for i, node in enumerate(picks):
                where = "root" if node is None else f"{node.rec.episode_key}:{node.rec.turn}"
                specs.append(self.spec(problem, episode, f"tree:{episode}:{where}", sample=i,
                                       round_=step, parent=None if node is None else node.rec))
                episode += 1
            keys += [sp.key for sp in specs]
            results = self.run_wave(specs)
            step += 1

    def fork_problem(self, problem: Problem, source: RunStore, at: int | NodeAddress) -> None:
        """Continue each source episode of `problem` after its turn `at` (or only the node `at`)
        as a new episode, whose context is the whole trajectory that led there."""
        latest = {e.episode_key: e for e in source.episodes() if e.problem_id == problem.id}
        tree = Tree([t for t in source.turns() if t.problem_id == problem.id],
                    {k: e.parent for k, e in latest.items()})
        # (episode, sample, source episode key, turn asked for, trajectory to continue)
        points: list[tuple[int, int, str, int, list[TurnRecord]]] = []
        if isinstance(at, NodeAddress):
            node = tree.find(at)
            if node is None:
                log.warning("%s: the source run has no node %s; nothing to fork", problem.id, at)
                return
            ep = latest.get(node.rec.episode_key)
            points.append((node.rec.episode, ep.sample if ep else 0, node.rec.episode_key,
                           node.rec.turn, tree.path(node)))
        else:
            for ep in sorted(latest.values(), key=lambda e: e.episode):
                own = sorted((n for n in tree.nodes.values() if n.rec.episode_key == ep.episode_key),
                             key=lambda n: n.rec.turn)[:at]
                prefix = tree.path(own[-1]) if own else tree.path_to(ep.parent)
                points.append((ep.episode, ep.sample, ep.episode_key, at, prefix))
        specs = []
        for episode, sample, key, turn, prefix in points:
            last = prefix[-1] if prefix else None
            specs.append(EpisodeSpec(
                problem=problem, key=episode_key(problem.sha256, self.digest, f"fork:{key}:{turn}"),
                episode=episode, sample=sample, max_turns=self.cfg.strategy.turns, prefix=prefix,
                parent=TurnRef(episode_key=last.episode_key if last else key, turn=last.turn if last else 0)))
        self.run_wave(specs)

    def run(self, problems: list[Problem],
            fork: tuple[RunStore, int | NodeAddress] | None = None) -> RunSummary:
        """Run the strategy over `problems` (or, given `fork=(source, at)`, fork the source run)."""
        def one(problem: Problem) -> None:
            if fork is None:
                self.run_problem(problem)
            else:
                self.fork_problem(problem, *fork)

        try:
            if self.concurrency == 1 or len(problems) == 1:
                for p in problems:
                    one(p)
            else:
                with ThreadPoolExecutor(self.concurrency, thread_name_prefix="problem") as pool:
                    list(pool.map(one, problems))
        except KeyboardInterrupt:
            self.write_summary("interrupted", f"stopped; continue with: kloop run --resume {self.store.root}")
            raise
        reached = self.run_meter.exceeded()
        return self.write_summary("budget" if reached else "finished", reached)

    # -- summary --------------------------------------------------------------------------------
    def write_summary(self, status: str, detail: str | None = None) -> RunSummary:
        with self._lock:
            summary = summarize(self.store.run_id, self.turns, self.records, self.best, status,
                                detail, executor=executor_report(self.env.evaluator))
            self.store.write_summary(summary)
        return summary


def restore_position(model: Model, turns: list[TurnRecord], calls: Iterable[CallRecord] = ()) -> None:
    """Give a model that keeps a position (scripted, replay) the replies already on disk: the
    turns', and the kept replies of an agent's calls whose step was cut off before its turn was
    written (the resumed step uses them; other unnamed calls are asked again).

    Providers without one (the HTTP APIs) need nothing: every query carries its whole context.
    """
    restore = getattr(model, "restore", None)
    named = {t.call_id for t in turns}
    cut_off = [c.reply for c in calls
               if c.phase == "answered" and c.reply is not None and c.call_id not in named]
    if restore is not None and (turns or cut_off):
        # A turn's summary call came before its query.
        restore([r for t in turns for r in ([t.summary.reply] if t.summary else []) + [t.reply]]
                + cut_off)


def executor_report(evaluator: Evaluator) -> ExecutorReport | None:
    """Which nodes an evaluator of several used, drained or lost (`agent.executor`); None for
    the local one, which has no `report`."""
    report = getattr(evaluator, "report", None)
    return report() if report is not None else None


def summarize(run_id: str, turns: dict[str, list[TurnRecord]], records: list[EpisodeRecord],
              best: dict[str, TurnRecord], status: str, detail: str | None = None,
              executor: ExecutorReport | None = None) -> RunSummary:
    """Run totals and the best kernel per problem, from the records alone."""
    latest = {r.episode_key: r for r in records}
    by_problem: dict[str, ProblemSummary] = {}
    for ep in latest.values():
        ps = by_problem.setdefault(ep.problem_id, ProblemSummary(
            problem_id=ep.problem_id, problem_stem=ep.problem_stem, episodes=0, turns=0))
        ps.episodes += 1
        ps.turns += ep.turns
        ps.stop_reasons[ep.stop_reason] = ps.stop_reasons.get(ep.stop_reason, 0) + 1
    for pid, rec in best.items():
        if pid in by_problem:
            by_problem[pid].best = best_of(rec)
            by_problem[pid].best_episode = rec.episode
    spend = total_spend([t for ts in turns.values() for t in ts], latest.values())
    return RunSummary(run_id=run_id, status=status, stop_detail=detail,
                      problems=sorted(by_problem.values(), key=lambda p: p.problem_id),
                      spend=spend, updated_at=utcnow(), executor=executor)
