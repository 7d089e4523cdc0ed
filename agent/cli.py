"""The `kloop` command line. Each area registers its own commands on the one Typer app."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.syntax import Syntax
from rich.table import Table

from problems.registry import ProblemError, load_problem_set

app = typer.Typer(
    name="kloop",
    help="Agentic multi-turn GPU-kernel generation for KernelBench, with an evaluator you can trust.",
    no_args_is_help=True,
    add_completion=False,
)
problems_app = typer.Typer(help="List and show reference problems.", no_args_is_help=True)
app.add_typer(problems_app, name="problems")
console = Console()
if not console.is_terminal:
    # Piped output (CI logs, `| less`) would otherwise be cut to 80 columns.
    console.width = 160

ProblemsDir = Annotated[
    Path | None,
    typer.Option(
        "--problems-dir",
        help="A KernelBench-format folder (a checkout's KernelBench/, one levelN/, or flat files).",
    ),
]


def _shape(shape: list | None) -> str:
    if not shape:
        return "?"
    if isinstance(shape[0], list):
        return ", ".join("x".join(map(str, s)) for s in shape)
    return "x".join(map(str, shape))


@problems_app.command("list")
def problems_list(
    level: Annotated[int | None, typer.Option(help="Only this level.")] = None,
    problems_dir: ProblemsDir = None,
    as_json: Annotated[bool, typer.Option("--json", help="One JSON array on stdout.")] = False,
) -> None:
    """A table of problems: id, name, parameters, output shape, flags."""
    try:
        pset = load_problem_set(problems_dir)
    except ProblemError as e:
        raise typer.BadParameter(str(e)) from None
    rows = pset.filter(level)
    if as_json:
        typer.echo(json.dumps([{"id": p.id, "stem": p.stem, **p.meta.model_dump()} for p in rows]))
        return
    table = Table(title=f"{len(rows)} problems from {pset.root}")
    for col in ("id", "name", "params", "output shape", "flags"):
        table.add_column(col, justify="right" if col == "params" else "left")
    for p in rows:
        params = f"{p.meta.params:,}" if p.meta.params is not None else "?"
        table.add_row(p.id, p.stem, params, _shape(p.meta.output_shape), " ".join(p.meta.flags()))
    console.print(table)


@problems_app.command("show")
def problems_show(problem_id: str, problems_dir: ProblemsDir = None) -> None:
    """Print one problem's source with its metadata."""
    try:
        p = load_problem_set(problems_dir).get(problem_id)
    except ProblemError as e:
        raise typer.BadParameter(str(e)) from None
    console.print(f"[bold]{p.id}[/bold]  {p.stem}  ({p.path})")
    console.print(f"sha256 (normalised): {p.sha256}")
    meta = p.meta
    console.print(f"params: {meta.params if meta.params is not None else '?'}   "
                  f"output: {_shape(meta.output_shape)}   flags: {' '.join(meta.flags()) or '-'}")
    for line in filter(None, [meta.degenerate_reason, meta.notes]):
        console.print(f"note: {line}")
    console.print(Syntax(p.source, "python", line_numbers=True))


def _register_optional() -> None:
    """Commands of other areas register themselves here (evaluator, agent loop, reports)."""
    import importlib

    for module in ("evaluator.cli", "agent.run", "agent.report_cli"):
        try:
            mod = importlib.import_module(module)
        except ModuleNotFoundError as e:
            if e.name != module:
                raise
            continue
        mod.register(app)


_register_optional()


def main() -> None:
    app()
