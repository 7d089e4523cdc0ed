"""Experiment sweeps: one file declares problems × models × strategies × context policies ×
feedback options × seeds, and every combination (a cell) runs as its own run directory.

A sweep file (YAML, or TOML with the same keys) holds one top-level `sweep:` mapping:

    sweep:
      name: turns-vs-samples
      base: {problems: [L3/1, L3/4], budget: {episode: {total_tokens: 200000}}}
      models: [openai:gpt-5-mini]
      strategies: [{turns: 8, samples: 4}, {turns: 1, samples: 32}]
      contexts: [full]
      feedback: [{label: profile, profile_feedback: true}, {label: plain, profile_feedback: false}]
      budgets: [{run: {calls: 8}}, {label: big, run: {calls: 32}}]
      seeds: [0, 1, 2]

The experiment directory (default `runs/<name>`):

    experiment.json      the manifest: the sweep as given and every cell's axes and config digest
    cells/<cell-id>/     one run directory per cell (the layout of agent/store.py)

Running a sweep again resumes it as a whole: cells whose run finished are skipped, cells that
were cut off continue from their turns on disk (the Runner's resume), new cells start. A cell
directory whose saved config no longer matches the sweep is an error, never overwritten.
"""

from __future__ import annotations

import itertools
import json
import logging
import re
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

import yaml
from kloop.agent.config import (
    AgentConfig,
    BudgetConfig,
    ConfigError,
    ContextPolicy,
    RunConfig,
    StrategyConfig,
    parse_layer,
    resolve,
)
from kloop.agent.models.base import ModelConfig
from kloop.agent.records import TRAJECTORY_SCHEMA_VERSION, EpisodeRecord, TurnRecord, utcnow
from kloop.agent.store import RunDirError, RunStore
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from kloop.errors import KloopError

log = logging.getLogger(__name__)

MANIFEST_NAME = "experiment.json"
CELLS_DIR = "cells"
DONE_STATUSES = ("finished", "budget")
"""Summary statuses after which a run has nothing left to do (a run budget is final too)."""
# Fields that may differ between a cell's saved config and the sweep without changing its work.
_WHERE = {"runs_dir", "run_id", "concurrency", "executor"}


class SweepError(KloopError, ValueError):
    """A sweep file or experiment directory that cannot be used as asked; says which and why."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ModelItem(ModelConfig):
    """One value of the models axis: a ModelConfig, with an optional label."""

    label: str | None = None


class StrategyItem(StrategyConfig):
    """One value of the strategies axis: a StrategyConfig, with an optional label."""

    label: str | None = None


class ContextItem(_Strict):
    """One value of the contexts axis."""

    context: ContextPolicy
    context_k: int | None = Field(None, ge=1)
    label: str | None = None


class FeedbackItem(AgentConfig):
    """One value of the feedback axis: AgentConfig fields (those set are applied), with a label."""

    label: str | None = None


class BudgetItem(BudgetConfig):
    """One value of the budgets axis: a BudgetConfig (episode and run limits), with a label."""

    label: str | None = None


class SweepConfig(_Strict):
    """The `sweep:` mapping of a sweep file."""

    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
    """Names the experiment (and its default directory `runs/<name>`)."""
    out: Path | None = None
    """The experiment directory (default: `runs/<name>`)."""
    configs: list[str] = Field(default_factory=list)
    """`-c`-style layers applied first: config files (relative to the sweep file) or key=value."""
    base: dict[str, Any] = Field(default_factory=dict)
    """A RunConfig layer every cell starts from (problems, budget, eval, ...)."""
    models: list[str | ModelItem] = Field(default_factory=list)
    """Model specs (`openai:gpt-5`) or ModelConfig mappings; empty: the base's model."""
    strategies: list[StrategyItem] = Field(default_factory=list)
    contexts: list[ContextPolicy | ContextItem] = Field(default_factory=list)
    feedback: list[FeedbackItem] = Field(default_factory=list)
    budgets: list[BudgetItem] = Field(default_factory=list)
    """Budgets to compare (limits in calls, tokens, dollars, eval or wall seconds); each
    replaces the base's budget. Empty: the base's, and cell ids have no budget part."""
    seeds: list[int] = Field(default_factory=lambda: [0], min_length=1)


class SweepFile(_Strict):
    sweep: SweepConfig


class Cell(BaseModel):
    """One combination of axis values, resolved into the config of one run."""

    cell_id: str
    axes: dict[str, str]
    """Axis name -> label of this cell's value (model, strategy, context, feedback, seed)."""
    seed: int
    config: RunConfig


class CellEntry(_Strict):
    cell_id: str
    axes: dict[str, str]
    seed: int
    digest: str
    path: str
    """The run directory, relative to the experiment directory."""


class ExperimentManifest(_Strict):
    """Contents of `experiment.json`; rewritten (atomically) each time the sweep is run."""

    schema_version: int = TRAJECTORY_SCHEMA_VERSION
    kind: Literal["experiment"] = "experiment"
    name: str
    sweep: dict[str, Any]
    """The sweep mapping as validated (JSON form)."""
    cells: list[CellEntry]
    updated_at: str


class CellOutcome(_Strict):
    cell_id: str
    path: str
    action: Literal["skipped", "started", "resumed"]
    status: str


class CellProgress(_Strict):
    """Where one cell stands while a sweep runs (`run_sweep(on_cell=...)`)."""

    cell_id: str
    index: int
    """1-based position of the cell in the sweep."""
    total: int
    state: Literal["waiting", "skipped", "running", "done"]
    turns: int = 0
    """Turns recorded so far (those of an earlier, interrupted run included)."""
    planned: int | None = None
    correct: int = 0
    """Turns so far whose kernel was correct."""
    calls: int = 0
    """LLM calls so far."""
    status: str | None = None
    """The run's summary status once the cell is done (or was skipped)."""

    def line(self) -> str:
        """The cell's progress line, as the CLI prints it."""
        head = f"[{self.index}/{self.total}] {self.cell_id}: "
        if self.state == "waiting":
            return head + "waiting"
        if self.state == "skipped":
            return head + f"skipped ({self.status} earlier)"
        of = f"/{self.planned}" if self.planned else ""
        body = f"{self.turns}{of} turns, {self.correct} correct, {self.calls} calls"
        return head + (f"{self.status}, {body}" if self.state == "done" else f"running, {body}")


# -- reading and expanding --------------------------------------------------------------------
def _read_mapping(path: Path) -> Any:
    text = path.read_text()
    if path.suffix.lower() == ".toml":
        try:
            import tomllib
        except ImportError:  # Python 3.10
            try:
                import tomli as tomllib  # type: ignore[no-redef]
            except ImportError:
                raise SweepError(f"{path}: TOML needs Python 3.11+ or `pip install tomli`; "
                                 "YAML sweep files work everywhere") from None
        try:
            return tomllib.loads(text)
        except tomllib.TOMLDecodeError as e:
            raise SweepError(f"{path}: not valid TOML: {e}") from None
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise SweepError(f"{path}: not valid YAML: {e}") from None


def is_sweep_file(path: str | Path) -> bool:
    """True when `path` is a YAML/TOML file whose top level holds a `sweep:` key."""
    path = Path(path)
    if not path.is_file() or path.suffix.lower() not in (".yaml", ".yml", ".toml", ".json"):
        return False
    try:
        data = _read_mapping(path)
    except (SweepError, OSError, UnicodeDecodeError):
        return False
    return isinstance(data, dict) and "sweep" in data


def _validation_message(where: str, e: ValidationError) -> str:
    lines = [f"  {'.'.join(map(str, err['loc'])) or '<root>'}: {err['msg']}" for err in e.errors()]
    return f"{where}:\n" + "\n".join(lines)


def load_sweep(path: str | Path) -> SweepFile:
    """Read and validate a sweep file; unknown keys are errors that name the key."""
    path = Path(path)
    if not path.is_file():
        raise SweepError(f"sweep file {path} does not exist")
    data = _read_mapping(path)
    if not isinstance(data, dict) or "sweep" not in data:
        raise SweepError(f"{path}: a sweep file holds a top-level `sweep:` mapping")
    try:
        return SweepFile.model_validate(data)
    except ValidationError as e:
        raise SweepError(_validation_message(f"invalid sweep file {path}", e)) from None


def _slug(text: str) -> str:
    slug = re.sub(r"[^A-Za-z0-9._-]+", "-", text).strip("-.")
    return slug or "x"


def _set_fields(item: BaseModel) -> dict[str, Any]:
    return {k: v for k, v in item.model_dump(mode="json", exclude_unset=True).items() if k != "label"}


def _model_values(sweep: SweepConfig) -> list[tuple[str, dict]]:
    out = []
    for m in sweep.models:
        if isinstance(m, str):
            out.append((m.partition(":")[2] or m, {"model": {"spec": m}}))
        else:
            out.append((m.label or m.spec.partition(":")[2] or m.spec, {"model": _set_fields(m)}))
    return out


def _strategy_label(s: StrategyItem) -> str:
    if s.label:
        return s.label
    if s.kind == "beam":
        return f"beam-w{s.beam_width}-e{s.expand}-r{s.rounds}-t{s.turns}"
    if s.kind == "tree":
        return f"tree-r{s.roots}-x{s.expansions}-t{s.turns}"
    if s.kind == "agent":
        return f"agent-{s.samples}x{s.turns}"
    return f"{s.samples}x{s.turns}"


def _context_values(sweep: SweepConfig) -> list[tuple[str, dict]]:
    out = []
    for c in sweep.contexts:
        if isinstance(c, str):
            out.append((c, {"agent": {"context": c}}))
        else:
            layer = {"context": c.context, **({"context_k": c.context_k} if c.context_k else {})}
            stem = {"last_k": "last", "digest": "digest", "summary": "summary"}.get(c.context)
            label = c.label or (f"{stem}{c.context_k}" if stem and c.context_k else c.context)
            out.append((label, {"agent": layer}))
    return out


def _feedback_values(sweep: SweepConfig) -> list[tuple[str, dict]]:
    out = []
    for i, f in enumerate(sweep.feedback):
        fields = _set_fields(f)
        if {"context", "context_k"} & fields.keys():
            raise SweepError("feedback items may not set context/context_k: use the contexts axis")
        label = f.label or ("-".join(f"{k}={v}" for k, v in sorted(fields.items())) or f"feedback{i}")
        out.append((label, {"agent": fields}))
    return out


def _budget_label(b: BudgetItem) -> str:
    if b.label:
        return b.label
    parts = [f"{'ep' if scope == 'episode' else 'run'}-{k}{v:g}"
             for scope in ("episode", "run")
             for k, v in getattr(b, scope).model_dump(exclude_none=True).items()]
    return "-".join(parts) or "unlimited"


def _budget_values(sweep: SweepConfig) -> list[tuple[str, dict]]:
    # Each value is the whole budget: a limit the base sets and this value does not is dropped,
    # so two values differ in what they say and in nothing else.
    return [(_budget_label(b), {"budget": b.model_dump(mode="json", exclude={"label"})})
            for b in sweep.budgets]


def _axes(sweep: SweepConfig) -> dict[str, list[tuple[str, dict]]]:
    """Each axis as (label, config layer) values; an axis left empty has one value: the base."""
    axes = {
        "model": _model_values(sweep),
        "strategy": [(_strategy_label(s), {"strategy": _set_fields(s)}) for s in sweep.strategies],
        "context": _context_values(sweep),
        "feedback": _feedback_values(sweep),
    }
    axes = {name: values or [("base", {})] for name, values in axes.items()}
    if sweep.budgets:  # only then: the cells of sweeps without one keep their ids
        axes["budget"] = _budget_values(sweep)
    axes["seed"] = [(f"seed{s}", {"seed": s}) for s in sweep.seeds]
    for name, values in axes.items():
        labels = [label for label, _ in values]
        if len(set(labels)) != len(labels):
            raise SweepError(f"axis {name}: two values have the same label {labels}; give each a `label:`")
    return axes


def _config_layers(sweep: SweepConfig, base_dir: Path) -> list[dict]:
    layers = []
    for spec in sweep.configs:
        local = base_dir / spec
        layers.append(parse_layer(str(local) if local.is_file() else spec))
    return [*layers, sweep.base]


def experiment_dir(sweep: SweepConfig) -> Path:
    return sweep.out if sweep.out is not None else Path("runs") / sweep.name


def expand(sweep: SweepConfig, base_dir: Path = Path(".")) -> list[Cell]:
    """Every cell of the sweep, with its fully validated RunConfig (errors before anything runs)."""
    axes = _axes(sweep)
    names = list(axes)
    cells_root = experiment_dir(sweep) / CELLS_DIR
    head = _config_layers(sweep, base_dir)
    cells: list[Cell] = []
    for combo in itertools.product(*(axes[n] for n in names)):
        labels = {n: label for n, (label, _) in zip(names, combo, strict=True)}
        cell_id = "__".join(_slug(labels[n]) for n in names)
        try:
            cfg = resolve([*head, *(layer for _, layer in combo),
                           {"runs_dir": str(cells_root), "run_id": cell_id}])
        except ConfigError as e:
            raise SweepError(f"cell {cell_id}: {e}") from None
        if not cfg.problems and cfg.level is None:
            raise SweepError("the sweep chooses no problems: set base.problems or base.level")
        cells.append(Cell(cell_id=cell_id, axes=labels, seed=cfg.seed, config=cfg))
    ids = [c.cell_id for c in cells]
    if len(set(ids)) != len(ids):
        raise SweepError("two cells have the same id after slugging their labels; give axis values distinct labels")
    return cells


# -- running ----------------------------------------------------------------------------------
Components = Callable[[RunConfig, list], tuple[Any, Any]]
"""(config, problems) -> (model, evaluator): what a cell runs with."""


def _default_components(cfg: RunConfig, problems: list) -> tuple[Any, Any]:
    from kloop.agent.components import build_evaluator, build_model

    return build_model(cfg), build_evaluator(cfg, problems)


def _comparable(cfg: RunConfig) -> dict[str, Any]:
    return cfg.model_dump(mode="json", exclude=_WHERE)


def _cell_state(cell: Cell) -> Literal["new", "done", "unfinished"]:
    root = cell.config.runs_dir / cell.cell_id
    if not (root / "config.json").is_file():
        if root.exists() and any(root.iterdir()):
            raise SweepError(f"{root} exists but is not a run directory; move it away")
        return "new"
    saved = RunStore.open(root).config_record().config
    if _comparable(saved) != _comparable(cell.config):
        raise SweepError(f"{root} was started with a different config than the sweep now gives "
                         "for this cell; use a new experiment directory (sweep.out) or restore the file")
    summary = root / "summary.json"
    if not summary.is_file() or json.loads(summary.read_text()).get("status") not in DONE_STATUSES:
        return "unfinished"
    # A run finishes even when some episodes stopped on an infrastructure error; the Runner
    # continues those on resume, so such a cell is not done.
    latest = {e.episode_key: e for e in RunStore.open(root).episodes()}
    if any(e.stop_reason == "infra_error" for e in latest.values()):
        return "unfinished"
    return "done"


def write_manifest(sweep: SweepConfig, cells: list[Cell]) -> Path:
    root = experiment_dir(sweep)
    root.mkdir(parents=True, exist_ok=True)
    manifest = ExperimentManifest(
        name=sweep.name, sweep=sweep.model_dump(mode="json", exclude_unset=True),
        cells=[CellEntry(cell_id=c.cell_id, axes=c.axes, seed=c.seed, digest=c.config.digest(),
                         path=f"{CELLS_DIR}/{c.cell_id}") for c in cells],
        updated_at=utcnow())
    path = root / MANIFEST_NAME
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(manifest.model_dump_json(indent=2) + "\n")
    tmp.replace(path)
    return path


def run_sweep(source: str | Path | SweepFile, *, only: list[str] | None = None,
              components: Components | None = None,
              on_turn: Callable[[TurnRecord], None] | None = None,
              on_episode: Callable[[EpisodeRecord], None] | None = None,
              on_cell: Callable[[CellProgress], None] | None = None) -> list[CellOutcome]:
    """Run every cell of a sweep (or the cells in `only`), skipping finished ones.

    `source` is a sweep file or a validated SweepFile (whose relative `configs` are then taken
    from the working directory). Cells run one after another; within a cell the run's own
    `concurrency` applies. `on_cell` hears every cell's progress: all of them waiting first,
    then each as it starts, after each of its turns, and when it is done.
    """
    from kloop.agent.components import load_problems
    from kloop.agent.strategies import Runner

    if isinstance(source, SweepFile):
        sweep, base_dir = source.sweep, Path(".")
    else:
        sweep, base_dir = load_sweep(source).sweep, Path(source).parent
    cells = expand(sweep, base_dir)
    if only:
        unknown = set(only) - {c.cell_id for c in cells}
        if unknown:
            raise SweepError(f"no such cell(s): {sorted(unknown)}; cells: {[c.cell_id for c in cells]}")
    states = {c.cell_id: _cell_state(c) for c in cells}  # every mismatch reported before any work
    write_manifest(sweep, cells)
    build = components or _default_components
    outcomes = []
    chosen = [c for c in cells if not only or c.cell_id in only]
    progress = {c.cell_id: CellProgress(cell_id=c.cell_id, index=i, total=len(chosen), state="waiting")
                for i, c in enumerate(chosen, start=1)}
    tell = on_cell or (lambda p: None)
    for p in progress.values():
        tell(p)
    for cell in chosen:
        root = cell.config.runs_dir / cell.cell_id
        state = states[cell.cell_id]
        if state == "done":
            log.info("cell %s: finished already, skipped", cell.cell_id)
            status = RunStore.open(root).summary().status
            tell(progress[cell.cell_id].model_copy(update={"state": "skipped", "status": status}))
            outcomes.append(CellOutcome(cell_id=cell.cell_id, path=str(root), action="skipped",
                                        status=status))
            continue
        try:
            problems = load_problems(cell.config)
        except ConfigError as e:
            raise SweepError(f"cell {cell.cell_id}: {e}") from None
        try:
            store = RunStore.open(root) if state == "unfinished" else RunStore.create(root, cell.config)
        except RunDirError as e:
            raise SweepError(f"cell {cell.cell_id}: {e}") from None
        log.info("cell %s: %s -> %s", cell.cell_id, "resuming" if state == "unfinished" else "starting", root)
        model, evaluator = build(cell.config, problems)
        watch = _CellWatch(progress[cell.cell_id], store, _planned(cell.config, len(problems)),
                           tell, on_turn)
        summary = Runner(cell.config, store, model, evaluator, watch.turn, on_episode).run(problems)
        watch.done(summary.status)
        outcomes.append(CellOutcome(cell_id=cell.cell_id, path=str(root),
                                    action="resumed" if state == "unfinished" else "started",
                                    status=summary.status))
    return outcomes


def _planned(cfg: RunConfig, problems: int) -> int:
    from kloop.agent.run import planned_turns

    return planned_turns(cfg, problems)


class _CellWatch:
    """Counts a running cell's turns into its progress line and passes each turn on."""

    def __init__(self, start: CellProgress, store: RunStore, planned: int,
                 tell: Callable[[CellProgress], None],
                 on_turn: Callable[[TurnRecord], None] | None):
        before = store.turns()
        self.p = start.model_copy(update={
            "state": "running", "planned": planned, "turns": len(before),
            "correct": sum(t.status == "correct" for t in before),
            "calls": sum(t.spend.calls for t in before)})
        self.tell, self.on_turn = tell, on_turn
        self._lock = threading.Lock()  # a cell's episodes run in parallel threads
        self.tell(self.p)

    def turn(self, rec: TurnRecord) -> None:
        with self._lock:
            self.p = self.p.model_copy(update={
                "turns": self.p.turns + 1, "correct": self.p.correct + (rec.status == "correct"),
                "calls": self.p.calls + rec.spend.calls})
            self.tell(self.p)
        if self.on_turn is not None:
            self.on_turn(rec)

    def done(self, status: str) -> None:
        self.p = self.p.model_copy(update={"state": "done", "status": status})
        self.tell(self.p)


def plan(source: str | Path) -> list[Cell]:
    """The cells a sweep file declares, validated, without running anything (a dry run)."""
    return expand(load_sweep(source).sweep, Path(source).parent)
