"""`kloop replay` (re-drive, rescore, fork) and a small `kloop show` turn viewer."""

from __future__ import annotations

from datetime import datetime, timezone
from pathlib import Path
from typing import Annotated

import typer
from kloop.agent import replay as replay_lib
from kloop.agent.config import ConfigError, parse_layer
from kloop.agent.records import NodeAddress
from kloop.agent.run import Reporter, _setup_logging, console, print_summary
from kloop.agent.store import RunStore

Opt = typer.Option


def replay_command(
    run_dir: Annotated[Path, typer.Argument(help="The recorded run directory.")],
    rescore: Annotated[bool, Opt(help="Re-evaluate every logged kernel instead of re-driving the loop.")] = False,
    fork_at: Annotated[str | None, Opt(help="Continue each episode after turn N, or one node EPISODE:TURN of each problem's search tree (`kloop show --tree` names them), with --model / -c.")] = None,
    model: Annotated[str | None, Opt(help="Model for --fork-at.")] = None,
    config: Annotated[list[str], Opt("-c", "--config", help="Overrides (file or key=value): any for --fork-at; eval.* and problem_overrides for --rescore.")] = [],  # noqa: B006
    size: Annotated[str | None, Opt(help="--rescore: small shrinks every problem (under the sizes the run was judged at, an import's included); full keeps them.")] = None,
    device: Annotated[str | None, Opt(help="Evaluator device.")] = None,
    policy: Annotated[str | None, Opt(help="Evaluator policy.")] = None,
    out: Annotated[Path | None, Opt(help="The new run directory (default runs/<source>-<kind>-<time>).")] = None,
    concurrency: Annotated[int | None, Opt(min=1, help="Kernels judged at once by --rescore (default: the run's own).")] = None,
    executor: Annotated[str | None, Opt(help="Where kernels are judged: local or ray (default: the run's own).")] = None,
    ray_address: Annotated[str | None, Opt(help="Ray cluster for --executor ray: auto, HOST:PORT or ray://HOST:PORT.")] = None,
    verbose: Annotated[bool, Opt("--verbose", "-v")] = False,
) -> None:
    """Re-drive a run with its recorded replies (no API calls), rescore it, or fork it."""
    _setup_logging(verbose)
    kind = "rescore" if rescore else "fork" if fork_at is not None else "replay"
    stamp = f"{datetime.now(timezone.utc):%Y%m%d-%H%M%S}"
    out = out or Path("runs") / f"{run_dir.name}-{kind}-{stamp}"
    eval_overrides = {k: v for k, v in {"device": device, "policy": policy}.items() if v is not None}
    point = fork_point(fork_at) if fork_at is not None else None
    ex = {k: v for k, v in {"kind": executor, "address": ray_address}.items() if v is not None}
    if executor == "local":
        ex["address"] = None  # a ray run's cluster address means nothing locally
    if model and fork_at is None:
        raise ConfigError("--model applies to --fork-at only")
    if config and fork_at is None and not rescore:
        raise ConfigError("-c applies to --fork-at and --rescore only")
    if size is not None and not rescore:
        raise ConfigError("--size applies to --rescore only")
    if concurrency is not None and not rescore:
        raise ConfigError("--concurrency applies to --rescore only")
    # Replay and rescore go through every recorded turn once: that is the bar's total.
    total = None if fork_at is not None else len(RunStore.open(run_dir).turns())
    with Reporter(total) as rep:
        if point is not None:
            layers = [parse_layer(c) for c in config] + [{"eval": eval_overrides},
                                                          {"executor": ex}]
            if model:
                layers.append({"model": {"spec": model}})
            runner = replay_lib.fork(run_dir, out, point, layers, on_turn=rep.on_turn)
            summary = runner.write_summary("finished")
        else:
            if rescore:
                report = replay_lib.rescore(run_dir, out, eval_overrides=eval_overrides,
                                            on_turn=rep.on_turn, concurrency=concurrency,
                                            executor=ex, size=size,
                                            layers=[parse_layer(c) for c in config])
            else:
                report = replay_lib.replay(run_dir, out, eval_overrides=eval_overrides,
                                           on_turn=rep.on_turn, executor=ex)
    if fork_at is not None:
        print_summary(summary, out)
        return
    print_summary(RunStore.open(out).summary(), out)
    if report.first_judged:
        console.print(f"{report.first_judged} kernel(s) never judged in {run_dir} got their first verdict")
    judged_before = report.turns_compared - report.first_judged
    if not report.differences and judged_before:
        console.print(f"all {judged_before} turns have the same verdict as in {run_dir}")
    for d in report.differences:
        console.print(f"  differs: {d.problem_id} ep {d.episode} turn {d.turn}: {d.before} -> {d.after}")
    if report.replies_unused:
        console.print(f"{report.replies_unused} recorded replies were not asked for (the path diverged)")


def fork_point(text: str) -> int | NodeAddress:
    """`--fork-at`: a turn number N, or a node address EPISODE:TURN."""
    try:
        if ":" in text:
            return NodeAddress.parse(text)
        if text.strip().isdigit():
            return int(text)
    except ValueError as e:
        raise ConfigError(f"--fork-at: {e}") from None
    raise ConfigError(f"--fork-at: {text!r} is neither a turn number nor a node EPISODE:TURN (like 3:1)")
