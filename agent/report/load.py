"""Read run and experiment directories into what the report computes from, and nothing else.

Everything a report says comes from the files of a run directory (config.json, turns.jsonl,
episodes.jsonl) plus the problem registry's metadata; never from a process's memory, and never
from summary.json (which is derived and may be stale).
"""

from __future__ import annotations

import hashlib
import json
import logging
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

from kloop.agent.components import chosen_problems
from kloop.agent.config import RunConfig
from kloop.agent.records import EpisodeRecord, TurnRecord
from kloop.agent.store import RunConfigRecord, RunDirError, RunStore
from kloop.agent.sweep import MANIFEST_NAME, ExperimentManifest
from kloop.problems.cost import ProblemCost, cost_of
from kloop.problems.registry import ProblemError, ProblemSet, load_problem_set

from kloop.errors import KloopError

log = logging.getLogger(__name__)

IMPORT_MARKER = "kloop_import"
"""Key in `reply.raw` of a turn imported from outside kloop (no model reply was recorded)."""
_OPERATIONAL = {"problems", "level", "problems_dir", "concurrency", "runs_dir", "run_id", "seed"}


class ReportError(KloopError, ValueError):
    """A path that is neither a run nor an experiment directory, or a run that cannot be read."""


@dataclass(frozen=True)
class ProblemInfo:
    """A problem of a run's set, with what the registry knows about it."""

    id: str
    stem: str
    degenerate: bool
    """Its output does not depend on its input at the run's tolerance (a constant passes)."""
    degenerate_at: float | None = None
    reason: str | None = None
    cost: ProblemCost | None = None
    """Its counted FLOPs and bytes per forward (`problems.cost`), for this version of its file."""


@dataclass
class RunData:
    """One run directory, read."""

    path: Path
    label: str
    record: RunConfigRecord
    turns: list[TurnRecord]
    episodes: list[EpisodeRecord]
    """The last record of each episode key, in file order."""
    problems: list[ProblemInfo]
    """The problem set: every problem the config asks for, in order (the fast_p denominator)."""
    tolerance: float | None
    axes: dict[str, str] = field(default_factory=dict)
    """Sweep axis -> label for experiment cells; empty for plain runs."""
    warnings: list[str] = field(default_factory=list)

    @property
    def config(self) -> RunConfig:
        return self.record.config

    @property
    def imported(self) -> bool:
        return any(IMPORT_MARKER in t.reply.raw for t in self.turns)

    @property
    def seed_group(self) -> str:
        """Runs that differ only in seed (and where they are stored) share this key."""
        data = self.config.model_dump(mode="json", exclude=_OPERATIONAL)
        data["problems"] = [p.id for p in self.problems]
        return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()[:16]


@dataclass
class Loaded:
    runs: list[RunData]
    notes: list[str] = field(default_factory=list)


@lru_cache(maxsize=4)
def _problem_set(problems_dir: Path | None) -> ProblemSet:
    return load_problem_set(problems_dir)


def run_tolerance(cfg: RunConfig) -> float | None:
    """The correctness tolerance of the run's policy and precision (None if unknown)."""
    from kloop.evaluator.common.config import UnknownPolicyError, get_policy

    try:
        policy = get_policy(cfg.eval.policy)
    except UnknownPolicyError:
        return None
    return policy.tolerance(cfg.eval.precision)


def _problem_set_of(cfg: RunConfig, tol: float | None, seen: list[str], episodes: list[EpisodeRecord],
                    warnings: list[str]) -> list[ProblemInfo]:
    try:
        chosen = chosen_problems(_problem_set(cfg.problems_dir), cfg)
    except ProblemError as e:
        warnings.append(f"problem set not resolvable ({e}); using the problems found in the records")
        return [ProblemInfo(id=p, stem=p, degenerate=False) for p in seen]
    out = []
    for p in chosen:
        at = p.meta.degenerate_at
        out.append(ProblemInfo(id=p.id, stem=p.stem, degenerate=at is not None and tol is not None and tol >= at,
                               degenerate_at=at, reason=p.meta.degenerate_reason, cost=cost_of(p)))
    extra = [pid for pid in seen if pid not in {p.id for p in out}]
    if extra:
        warnings.append(f"records hold problems outside the config's set (left out): {extra}")
    shas = {p.id: p.sha256 for p in chosen}
    changed = sorted({e.problem_id for e in episodes
                      if e.problem_id in shas and e.problem_sha256 != shas[e.problem_id]})
    if changed:
        warnings.append(f"problem files changed since the run for {changed}: results are for the old versions")
    return out


def provenance_warnings(record: RunConfigRecord, turns: list[TurnRecord]) -> list[str]:
    """Where the replies, token counts and timings of a run come from, when not the obvious."""
    out = []
    if record.config.model.spec.startswith("scripted:"):
        out.append(f"replies are scripted ({record.config.model.spec}), not model output")
    counted = {str(t.reply.raw.get("scripted", {}).get("usage_counted_by")) for t in turns
               if isinstance(t.reply.raw.get("scripted"), dict)
               and t.reply.raw["scripted"].get("usage_counted_by")}
    if counted:
        out.append(f"token counts are counted by {', '.join(sorted(counted))} over the recorded "
                   "text, not provider-reported")
    # The trusted harness clock on a GPU is a GPU timing (comparable); only a host clock (CPU
    # runs) is not. Checking for `cuda_event` alone called every strict GPU run host-timed.
    host = sorted({t.eval.device for t in turns if t.eval is not None and t.eval.timing is not None
                   and not t.eval.timing.comparable})
    if host:
        out.append(f"timings measured on {', '.join(host)} with a host clock: eval seconds and "
                   "runtimes are not GPU numbers")
    return out


def load_run(path: Path, label: str | None = None, axes: dict[str, str] | None = None) -> RunData:
    """Read one run directory."""
    try:
        store = RunStore.open(path)
        record = store.config_record()
        turns = store.turns()
        episodes = list({e.episode_key: e for e in store.episodes()}.values())
    except (RunDirError, ValueError) as e:
        raise ReportError(f"{path}: {e}") from None
    if not turns and not episodes:
        raise ReportError(f"{path}: no turns recorded (a run that never started); nothing to report")
    warnings: list[str] = []
    seen = list(dict.fromkeys([t.problem_id for t in turns] + [e.problem_id for e in episodes]))
    tol = run_tolerance(record.config)
    problems = _problem_set_of(record.config, tol, seen, episodes, warnings)
    if record.config.problem_overrides:
        warnings.append(f"problem sizes overridden for {sorted(record.config.problem_overrides)}: speedups "
                        "and degenerate marks are not those of the full-size problems")
    warnings += provenance_warnings(record, turns)
    if record.kind in ("rescore", "replay", "fork"):
        warnings.append(f"this run is a {record.kind} of {record.source_run}")
    return RunData(path=Path(path), label=label or Path(path).name, record=record, turns=turns,
                   episodes=episodes, problems=problems, tolerance=tol, axes=axes or {},
                   warnings=warnings)


def _load_experiment(root: Path, loaded: Loaded) -> None:
    try:
        manifest = ExperimentManifest.model_validate_json((root / MANIFEST_NAME).read_text())
    except ValueError as e:
        raise ReportError(f"{root / MANIFEST_NAME}: not a valid experiment manifest: {e}") from None
    for cell in manifest.cells:
        cell_dir = root / cell.path
        if not (cell_dir / "config.json").is_file():
            loaded.notes.append(f"{manifest.name}: cell {cell.cell_id} has not started (no run directory)")
            continue
        loaded.runs.append(load_run(cell_dir, cell.cell_id, cell.axes))


def _is_target(d: Path) -> bool:
    return (d / "config.json").is_file() or (d / MANIFEST_NAME).is_file()


def load_targets(paths: list[Path]) -> Loaded:
    """Runs from run directories, experiment directories, or folders of run directories."""
    loaded = Loaded(runs=[])
    for raw in paths:
        path = Path(raw)
        if (path / "config.json").is_file():
            loaded.runs.append(load_run(path))
        elif (path / MANIFEST_NAME).is_file():
            _load_experiment(path, loaded)
        elif path.is_dir() and (subs := sorted(d for d in path.iterdir() if _is_target(d))):
            for d in subs:
                if (d / "config.json").is_file():
                    loaded.runs.append(load_run(d))
                else:
                    _load_experiment(d, loaded)
        else:
            raise ReportError(f"{path} is neither a run directory (config.json) nor an experiment "
                              f"directory ({MANIFEST_NAME}), nor a folder of them")
    if not loaded.runs:
        raise ReportError("no runs to report on: " + "; ".join(loaded.notes or map(str, paths)))
    _unique_labels(loaded.runs)
    return loaded


def _unique_labels(runs: list[RunData]) -> None:
    counts: dict[str, int] = {}
    for r in runs:
        counts[r.label] = counts.get(r.label, 0) + 1
    for r in runs:
        if counts[r.label] > 1:
            r.label = f"{r.path.parent.name}/{r.label}"
