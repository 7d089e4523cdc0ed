"""The run scripts behind `kloop run`, `kloop replay` and `kloop show`.

They turn flags and config files into a RunConfig, pick the concrete model and evaluator, and
hand them to the Runner; progress and the final table are printed here and nowhere else.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime, timezone
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.live import Live
from rich.logging import RichHandler
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    ProgressColumn,
    Task,
    TextColumn,
    TimeElapsedColumn,
)
from rich.table import Table
from rich.text import Text

from kloop.agent.components import build_evaluator, build_model, load_problems, with_size
from kloop.agent.config import ConfigError, RunConfig, dotted, merge, parse_layer, resolve
from kloop.agent.records import EpisodeRecord, RunSummary, TurnRecord
from kloop.agent.store import RunDirError, RunStore
from kloop.agent.strategies import Runner
from kloop.agent.sweep import CellProgress, is_sweep_file, run_sweep
from kloop.console import make_console

console = make_console(stderr=True)
DEMO_DIR = Path(__file__).resolve().parent / "demo"
Opt = typer.Option


def _flags(**given: Any) -> dict[str, Any]:
    """CLI flags as a config layer; flags left unset add nothing."""
    paths = {
        "problem": "problems", "level": "level", "model": "model.spec", "base_url": "model.base_url",
        "turns": "strategy.turns", "samples": "strategy.samples", "strategy": "strategy.kind",
        "context": "agent.context", "backend": "agent.backend", "prompts_dir": "agent.prompts_dir",
        "device": "eval.device", "policy": "eval.policy", "concurrency": "concurrency",
        "runs_dir": "runs_dir", "run_id": "run_id", "budget_calls": "budget.run.calls",
        "budget_tokens": "budget.run.total_tokens", "budget_cost": "budget.run.cost_usd",
        "budget_eval_s": "budget.run.eval_s", "budget_gpu_s": "budget.run.gpu_s",
        "budget_wall_s": "budget.run.wall_s",
        "executor": "executor.kind", "ray_address": "executor.address",
    }
    layer: dict[str, Any] = {}
    for name, value in given.items():
        if value is None or value == []:
            continue
        layer = merge(layer, dotted(paths[name], str(value) if isinstance(value, Path) else value))
    return layer


def _near(path: Path) -> str:
    """`path` relative to the working directory when under it (keeps run configs portable)."""
    try:
        return str(path.relative_to(Path.cwd()))
    except ValueError:
        return str(path)


def _setup_logging(verbose: bool) -> None:
    logging.basicConfig(level=logging.INFO if verbose else logging.WARNING, format="%(message)s",
                        handlers=[RichHandler(console=console, show_path=False)], force=True)


def planned_turns(cfg: RunConfig, problems: int) -> int:
    s = cfg.strategy
    per_problem = {"beam": s.rounds * s.beam_width * s.expand,
                   "tree": s.roots + s.expansions}.get(s.kind or "", s.samples)
    return problems * per_problem * s.turns


class PipelineColumn(ProgressColumn):
    """Where the evaluations in flight are (building, waiting for the device, on it): read at
    each refresh, so the line moves between turns too."""

    def render(self, task: Task) -> Text:
        from kloop.agent.executor import ray_pool
        from kloop.evaluator.procs import board

        return Text(ray_pool.describe() or board.describe(), style="dim")


class Reporter:
    """A progress bar over the planned turns, one line per turn and per episode."""

    def __init__(self, total: int | None = None):
        self.progress = Progress(TextColumn("{task.description}"), BarColumn(),
                                 MofNCompleteColumn(), TimeElapsedColumn(), PipelineColumn(),
                                 console=console,
                                 disable=not console.is_terminal)  # piped: the turn lines only
        self.task = self.progress.add_task("turns", total=total)

    def __enter__(self) -> Reporter:
        self.progress.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.progress.stop()

    def on_turn(self, t: TurnRecord) -> None:
        self.progress.advance(self.task)
        ev = t.eval
        extra = f" {ev.runtime_ms:.4g} ms" if ev is not None and ev.runtime_ms is not None else ""
        speed = f" ({ev.speedup_vs_eager:.2f}x eager)" if ev is not None and ev.speedup_vs_eager else ""
        # A fork's or a child's prompts count the inherited turns: say where the turn sits there.
        seen = f" (turn {t.position} of its trajectory)" if t.position not in (None, t.turn) else ""
        console.print(f"  {t.problem_id} ep {t.episode} turn {t.turn}{seen}: [bold]{t.status}[/bold]"
                      f"{extra}{speed}")

    def on_episode(self, e: EpisodeRecord) -> None:
        console.print(f"{e.problem_id} episode {e.episode} stopped: {e.stop_reason} ({e.stop_detail})")


_BASELINE_SHORT = {"eager": "eager", "compile": "compile", "compile_ro": "ro"}
"""How the `x best` column names the fastest baseline (`ro`: torch.compile reduce-overhead)."""


def print_summary(summary: RunSummary, root: Path) -> None:
    table = Table(title=f"run {summary.run_id}: {summary.status}")
    for col in ("problem", "eps", "turns", "best (ep/turn)", "runtime", "x eager", "x compile", "x best",
                "stops"):
        table.add_column(col, overflow="fold")
    host_clock = False
    for p in summary.problems:
        b = p.best
        host_clock |= b is not None and not b.comparable
        fmt = lambda v, s="": "-" if v is None else f"{v:.3g}{s}"  # noqa: E731
        table.add_row(p.problem_id, str(p.episodes), str(p.turns),
                      f"{p.best_episode}/{b.turn}" if b else "none correct",
                      fmt(b and b.runtime_ms, " ms"), fmt(b and b.speedup_vs_eager, "x"),
                      fmt(b and b.speedup_vs_compile, "x"),
                      fmt(b and b.speedup_vs_best, f"x {_BASELINE_SHORT[b.best_baseline]}"
                          if b and b.best_baseline else "x"),
                      ", ".join(f"{k} {v}" for k, v in p.stop_reasons.items()))
    make_console().print(table)
    s = summary.spend
    console.print(f"{s.calls} LLM calls, {s.input_tokens} in / {s.output_tokens} out tokens, "
                  f"${s.cost_usd:.4f}{' (+unpriced calls)' if s.unpriced_calls else ''}, "
                  f"{s.eval_s:.1f} s evaluating ({s.gpu_s:.1f} s holding the device), "
                  f"run dir {root}")
    if host_clock:
        console.print("runtimes were measured with a host clock (no GPU): not comparable with GPU numbers")
    if summary.stop_detail:
        console.print(f"stopped: {summary.stop_detail}")
    ex = summary.executor
    if ex is not None:
        used = f"{len(ex.nodes)} Ray node(s), {ex.requeued} evaluation(s) re-queued"
        gone = "; ".join(f"{n.address} [{n.node_id[:12]}] {n.state} after {n.lost} lost "
                         "evaluation(s)" for n in ex.gone())
        console.print(f"{used}{'; ' + gone if gone else ''}")


@contextmanager
def guarded(store: RunStore) -> Iterator[None]:
    """Around a run: Ctrl-C says how to continue; a run that failed before its first turn
    leaves no directory behind (`show` and `report` would take it for an empty run)."""
    try:
        yield
    except KeyboardInterrupt:
        detail = store.summary().stop_detail if (store.root / "summary.json").exists() else None
        console.print(detail or f"stopped; continue with: kloop run --resume {store.root}")
        raise typer.Exit(130) from None
    except BaseException:
        store.discard_if_unstarted()
        raise


def start(cfg: RunConfig) -> tuple[RunSummary, Path]:
    """Create the run directory for `cfg` and run it."""
    problems = load_problems(cfg)
    model, evaluator = build_model(cfg), build_evaluator(cfg, problems)
    run_id = cfg.run_id or f"{datetime.now(timezone.utc):%Y%m%d-%H%M%S}-{cfg.digest()[:8]}"
    cfg = cfg.model_copy(update={"run_id": run_id})
    store = RunStore.create(cfg.runs_dir / run_id, cfg)
    console.print(f"run {run_id}: {len(problems)} problem(s), strategy {cfg.strategy.kind}, "
                  f"model {cfg.model.spec} -> {store.root}")
    _warm_up(evaluator, problems, cfg)
    with guarded(store), Reporter(planned_turns(cfg, len(problems))) as rep:
        summary = Runner(cfg, store, model, evaluator, rep.on_turn, rep.on_episode).run(problems)
    return summary, store.root


def _warm_up(evaluator: object, problems: list, cfg: RunConfig) -> None:
    """First use beside the first turns: this process's evaluator starts the kept baseline
    workers of the problems the run starts with (`LocalEvaluator.warm_up`; a Ray pool's
    workers start their own at their first candidates)."""
    from kloop.agent.components import LocalEvaluator

    if isinstance(evaluator, LocalEvaluator):
        evaluator.warm_up(problems, cfg.concurrency)


def resume(run_dir: Path) -> tuple[RunSummary, Path]:
    """Continue a run where it stopped: finished episodes are kept, cut-off ones continue."""
    store = RunStore.open(run_dir)
    record = store.config_record()
    if record.kind == "rescore":
        raise RunDirError(f"{run_dir} is a rescore; run `kloop replay {record.source_run} --rescore` again")
    cfg = record.config
    problems = load_problems(cfg)
    fork = (RunStore.open(Path(record.source_run)), record.fork_at) if record.kind == "fork" else None
    model, evaluator = build_model(cfg), build_evaluator(cfg, problems)
    with guarded(store), Reporter(None if fork else planned_turns(cfg, len(problems))) as rep:
        runner = Runner(cfg, store, model, evaluator, rep.on_turn, rep.on_episode)
        done = sum(len(t) for t in runner.turns.values())
        rep.progress.advance(rep.task, done)
        console.print(f"resuming {store.root}: {done} turn(s) and {len(runner.finished)} "
                      "finished episode(s) on disk")
        return runner.run(problems, fork=fork), store.root


def run_command(
    config: Annotated[list[str], Opt("-c", "--config", help="YAML file or key=value override (repeatable, merged in order).")] = [],  # noqa: B006
    problem: Annotated[list[str], Opt("--problem", "-p", help="Problem id, e.g. L3/4 (repeatable).")] = [],  # noqa: B006
    level: Annotated[int | None, Opt(help="Every problem of this level.")] = None,
    model: Annotated[str | None, Opt(help="openai:<m>, anthropic:<m>, scripted:<file>, replay:<run-dir>.")] = None,
    base_url: Annotated[str | None, Opt(help="OpenAI-compatible server URL.")] = None,
    turns: Annotated[int | None, Opt(help="Turns per episode (T).")] = None,
    samples: Annotated[int | None, Opt(help="Episodes per problem (N).")] = None,
    strategy: Annotated[str | None, Opt(help="sequential, best_of_n, grid, beam, tree or agent (a tool-using agent).")] = None,
    context: Annotated[str | None, Opt(help="full, last_k, last, digest or summary.")] = None,
    backend: Annotated[str | None, Opt(help="cuda or triton.")] = None,
    device: Annotated[str | None, Opt(help="Evaluator device: auto, cpu, cuda, cuda:N.")] = None,
    policy: Annotated[str | None, Opt(help="Evaluator policy (strict, kernelbench).")] = None,
    prompts_dir: Annotated[Path | None, Opt(help="Templates that replace the packaged ones.")] = None,
    out: Annotated[Path | None, Opt(help="The run directory to create (default RUNS_DIR/<time-digest>).")] = None,
    runs_dir: Annotated[Path | None, Opt(help="Parent of run directories (default runs/).")] = None,
    concurrency: Annotated[int | None, Opt(help="Episodes in parallel.")] = None,
    executor: Annotated[str | None, Opt(help="Where candidates are judged: local (default) or ray.")] = None,
    ray_address: Annotated[str | None, Opt(help="Ray cluster: auto, HOST:PORT or ray://HOST:PORT (default: a local one).")] = None,
    dry_run: Annotated[bool, Opt(help="Print where evaluations would run (the placement) and stop.")] = False,
    budget_calls: Annotated[int | None, Opt(help="Run limit: LLM calls.")] = None,
    budget_tokens: Annotated[int | None, Opt(help="Run limit: input + output tokens.")] = None,
    budget_cost: Annotated[float | None, Opt(help="Run limit: dollars.")] = None,
    budget_eval_s: Annotated[float | None, Opt(help="Run limit: evaluation seconds.")] = None,
    budget_gpu_s: Annotated[float | None, Opt(help="Run limit: seconds the evaluations held the device (GPU-seconds).")] = None,
    budget_wall_s: Annotated[float | None, Opt(help="Run limit: wall-clock seconds.")] = None,
    resume_dir: Annotated[Path | None, Opt("--resume", help="Continue this run directory.")] = None,
    size: Annotated[str | None, Opt(help="small: shrink every problem's size constants for CPU use (as kloop eval --size small).")] = None,
    demo: Annotated[bool, Opt(help="Run the bundled scripted example (no API key, no GPU needed).")] = False,
    verbose: Annotated[bool, Opt("--verbose", "-v")] = False,
) -> None:
    """Run the agent loop over problems and log every turn to a run directory."""
    _setup_logging(verbose)
    flags = _flags(problem=problem, level=level, model=model, base_url=base_url, turns=turns,
                   samples=samples, strategy=strategy, context=context, backend=backend,
                   prompts_dir=prompts_dir, device=device, policy=policy, concurrency=concurrency,
                   executor=executor, ray_address=ray_address,
                   runs_dir=out.parent if out else runs_dir, run_id=out.name if out else None,
                   budget_calls=budget_calls, budget_tokens=budget_tokens, budget_cost=budget_cost,
                   budget_eval_s=budget_eval_s, budget_gpu_s=budget_gpu_s,
                   budget_wall_s=budget_wall_s)
    if len(config) == 1 and is_sweep_file(config[0]):
        if flags or demo or resume_dir is not None:
            raise ConfigError("a sweep file declares everything; give it alone: kloop run -c sweep.yaml")
        _run_sweep(Path(config[0]))
        return
    if resume_dir is not None:
        if flags or config or demo or size or dry_run:
            raise ConfigError("--resume continues a run with its saved config; give no other options")
        summary, root = resume(resume_dir)
    else:
        layers = [parse_layer(str(DEMO_DIR / "demo.yaml")),
                  {"model": {"spec": f"scripted:{_near(DEMO_DIR / 'replies.yaml')}"}}] if demo else []
        cfg = resolve(layers + [parse_layer(c) for c in config] + [flags])
        if size is not None:
            cfg = with_size(cfg, size)
            from kloop.evaluator.tools.cli import small_on_gpu

            if (warning := small_on_gpu(size, cfg.eval.device)) is not None:
                print(warning, file=sys.stderr)
        if dry_run:
            for line in placement(cfg):
                make_console().print(line)
            return
        if demo and cfg.run_id is None:
            cfg = cfg.model_copy(update={"run_id": f"demo-{datetime.now(timezone.utc):%Y%m%d-%H%M%S}"})
        summary, root = start(cfg)
    print_summary(summary, root)


def placement(cfg: RunConfig) -> list[str]:
    """Where `cfg`'s evaluations would run, in words (`kloop run --dry-run`)."""
    ex = cfg.executor
    if ex.kind == "local":
        from kloop.evaluator.procs.devicepool import pool

        return [f"local executor: evaluations run in this process on {', '.join(pool(cfg.eval.device))}"
                f" ({cfg.concurrency} episode(s) at once)"]
    from kloop.agent.executor.placement import describe, plan
    from kloop.agent.executor.ray_pool import connect, import_ray

    ray = import_ray()
    owns = connect(ex)
    try:
        slots = plan(ray.nodes(), ex.resource)
    finally:
        if owns:
            ray.shutdown()
    where = ex.address or "a Ray instance started on this machine"
    return [f"ray executor on {where}:"] + [f"  {line}" for line in
                                            describe(slots, ex.resource, ex.worker_concurrency,
                                                     cfg.concurrency)]


class SweepProgress:
    """One line per cell while a sweep runs: redrawn in place on a terminal, printed whenever a
    cell's line changes when piped (a log file gets every step, in order)."""

    def __init__(self, out: Console | None = None):
        self.console = out or console
        self.lines: dict[str, str] = {}
        self.live = Live(Text(""), console=self.console, auto_refresh=False,
                         transient=False) if self.console.is_terminal else None

    def __enter__(self) -> SweepProgress:
        if self.live is not None:
            self.live.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self.live is not None:
            self.live.stop()

    def update(self, p: CellProgress) -> None:
        line = p.line()
        if self.lines.get(p.cell_id) == line:
            return
        self.lines[p.cell_id] = line
        if self.live is not None:
            self.live.update(Text("\n".join(self.lines.values())), refresh=True)
        else:
            self.console.print(line, highlight=False, soft_wrap=True)


def _run_sweep(path: Path) -> None:
    """Every cell of a sweep into one experiment directory; finished cells are skipped."""
    with SweepProgress() as progress:
        outcomes = run_sweep(path, on_cell=progress.update)
    table = Table(title=f"sweep {path}")
    for col in ("cell", "action", "status", "run directory"):
        table.add_column(col)
    for o in outcomes:
        table.add_row(o.cell_id, o.action, o.status, o.path)
    make_console().print(table)


def register(app: typer.Typer) -> None:
    from kloop.agent.replay_cli import replay_command

    app.command("run")(run_command)
    app.command("replay")(replay_command)

