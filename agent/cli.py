"""The `kloop` command line. Each area registers its own commands on the one Typer app.

`main()` is the one place where errors meet the user: a `KloopError` (or a problem-registry
error) becomes one line on stderr and exit status 2; `--debug` shows the traceback instead.
Nothing here imports torch, so `kloop --help` answers at once.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated

import typer
from kloop.problems.registry import ProblemError, load_problem_set
from rich.table import Table
from typer.core import TyperGroup

from kloop.console import make_console
from kloop.errors import KloopError

CONTEXT = {"help_option_names": ["-h", "--help"]}
_debug = False
"""Set by `main` for `--debug`: errors then propagate with their traceback."""


class _Group(TyperGroup):
    """The root command group: a user error in any command becomes one line and exit 2, for
    `main` and for anything that invokes the app directly (tests, `CliRunner`)."""

    def invoke(self, ctx):
        try:
            return super().invoke(ctx)
        except (KloopError, ProblemError) as e:
            if _debug:
                raise
            typer.echo(f"error: {' '.join(str(e).split())}", err=True)  # one line, always
            raise typer.Exit(2) from None


app = typer.Typer(
    cls=_Group,
    name="kloop",
    help="Agentic multi-turn GPU-kernel generation for KernelBench, with an evaluator you can trust.",
    no_args_is_help=True,
    add_completion=False,
    context_settings=CONTEXT,
    pretty_exceptions_enable=False,
)
problems_app = typer.Typer(help="List and show reference problems.", no_args_is_help=True,
                           context_settings=CONTEXT)
app.add_typer(problems_app, name="problems")
console = make_console()

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
    pset = load_problem_set(problems_dir)
    rows = pset.filter(level)
    if not rows and level is not None and not as_json:  # JSON: an empty list is the answer
        levels = [lv for lv in pset.levels() if lv is not None]
        raise KloopError(f"no level-{level} problems in {pset.root} (it has levels "
                         f"{', '.join(map(str, levels)) or 'none'}); give --problems-dir with a "
                         "KernelBench checkout's KernelBench/ folder for other levels")
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
    """Print one problem's metadata (stderr) and its source as-is (stdout, copyable)."""
    p = load_problem_set(problems_dir).get(problem_id)
    info = make_console(stderr=True)
    info.print(f"[bold]{p.id}[/bold]  {p.stem}  ({p.path})")
    info.print(f"sha256 (normalised): {p.sha256}")
    meta = p.meta
    info.print(f"params: {meta.params if meta.params is not None else '?'}   "
               f"output: {_shape(meta.output_shape)}   flags: {' '.join(meta.flags()) or '-'}")
    for line in filter(None, [meta.degenerate_reason, meta.notes]):
        info.print(f"note: {line}")
    # Plain text, no line numbers or colour: the source must paste back into a file unchanged.
    sys.stdout.write(p.source if p.source.endswith("\n") else p.source + "\n")


def _register_optional() -> None:
    """Commands of other areas register themselves here (evaluator, agent loop, reports)."""
    import importlib

    for module in ("kloop.evaluator.tools.cli", "kloop.agent.run", "kloop.agent.report_cli"):
        try:
            mod = importlib.import_module(module)
        except ModuleNotFoundError as e:
            if e.name != module:
                raise
            continue
        mod.register(app)


_register_optional()


def _version(value: bool) -> None:
    if value:
        from kloop.agent.store import kloop_version

        typer.echo(f"kloop {kloop_version()}")
        raise typer.Exit()


@app.callback()
def _root(
    version: Annotated[bool, typer.Option("--version", callback=_version, is_eager=True,
                                          help="Print the version and exit.")] = False,
    debug: Annotated[bool, typer.Option("--debug", help="Show tracebacks of errors.")] = False,
) -> None:
    """Agentic multi-turn GPU-kernel generation for KernelBench, with an evaluator you can trust."""


def main(argv: list[str] | None = None) -> None:
    """Run `kloop`: usage errors and `KloopError`s exit 2 with one line, never a traceback."""
    global _debug
    args = list(sys.argv[1:] if argv is None else argv)
    _debug = "--debug" in args
    args = [a for a in args if a != "--debug"]  # accepted anywhere, not only before the command
    try:
        code = app(args=args, prog_name="kloop", standalone_mode=False)
    except typer.TyperException as e:  # usage errors: Typer's own short message, exit 2
        show = getattr(e, "show", None)
        show() if show is not None else typer.echo(f"error: {e.format_message()}", err=True)
        code = e.exit_code
    except (typer.Abort, KeyboardInterrupt):
        typer.echo("interrupted", err=True)
        code = 130
    sys.exit(code if isinstance(code, int) else 0)



if __name__ == "__main__":  # python -m agent.cli (a driver started without the kloop script)
    main()
