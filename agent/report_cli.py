"""`kloop report`, `kloop show`, `kloop import kernelbench` and `kloop export`."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from kloop.agent.report import DEFAULT_BOOTSTRAP
from kloop.agent.store import RunDirError
from rich.table import Table

from kloop.console import make_console

Opt = typer.Option
err = make_console(stderr=True)


def _fail(message: str) -> typer.Exit:
    err.print(f"[red]error:[/red] {message}", soft_wrap=True)
    return typer.Exit(2)


def _tracked(path: Path) -> bool:
    """Whether git tracks files under `path` (a committed example run, say)."""
    import subprocess

    try:
        out = subprocess.run(["git", "ls-files", "--error-unmatch", "."], cwd=path,
                             capture_output=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return out.returncode == 0


def _default_out(paths: list[Path]) -> Path:
    """RUN/report for one untracked run; otherwise runs/reports/<names> (runs/ is git-ignored),
    so a report never lands in a tracked folder unless asked with --out."""
    if len(paths) == 1 and paths[0].is_dir() and not _tracked(paths[0]):
        return paths[0] / "report"
    return Path("runs") / "reports" / "-vs-".join(p.resolve().name for p in paths[:3])


def report_command(
    paths: Annotated[list[Path], typer.Argument(help="Run directories, experiment directories, or folders of runs.")],
    out: Annotated[Path | None, Opt(help="Where to write report.md and the PNGs (default: RUN/report, or runs/reports/<names> for several runs or a git-tracked one).")] = None,
    html: Annotated[bool, Opt("--html", help="Also write report.html: one self-contained page.")] = False,
    as_json: Annotated[bool, Opt("--json", help="Also write report.json and print it on stdout.")] = False,
    bootstrap: Annotated[int, Opt(help="Bootstrap resamples for confidence intervals (0: none).")] = DEFAULT_BOOTSTRAP,
    seed: Annotated[int, Opt(help="Seed of the bootstrap.")] = 0,
    scope: Annotated[str, Opt(help="Budget curves per `problem` (default) or for the whole `run`.")] = "problem",
) -> None:
    """Metrics, budget curves and plots of runs, side by side (Markdown; --html, --json)."""
    from kloop.agent.report.build import build_report, write_report
    from kloop.agent.report.load import ReportError

    if scope not in ("problem", "run"):
        raise _fail(f"--scope must be problem or run, not {scope!r}")
    try:
        report = build_report(paths, n_boot=bootstrap, seed=seed, scope=scope)  # type: ignore[arg-type]
    except (ReportError, RunDirError) as e:
        raise _fail(str(e)) from None
    files = write_report(report, out or _default_out(paths), html=html, json=as_json)
    table = Table(title="kloop report")
    for col in ("run", "correct", "fast_1.0 eager", "fast_1.0 compile", "fast_1.0 best", "geomean eager (correct)"):
        table.add_column(col)
    for r in report.runs:
        m = r.metrics
        fmt = lambda v: "-" if v is None else f"{v:.2f}"  # noqa: E731
        table.add_row(r.label, f"{m.correct:g}/{m.problems}", fmt(m.fast(1.0)), fmt(m.fast(1.0, "compile")),
                      fmt(m.fast(1.0, "best")),
                      "-" if m.geomean_vs_eager.value is None else f"{m.geomean_vs_eager.value:.3g}x")
    err.print(table)
    for name in filter(None, [files.markdown, files.html, files.json_path]):
        err.print(f"wrote {name}")
    if as_json and files.json_path:
        typer.echo(Path(files.json_path).read_text(), nl=False)


def show_command(
    run_dir: Annotated[Path, typer.Argument(help="A run directory.")],
    problem: Annotated[str | None, Opt("--problem", "-p", help="Problem id (L3/4) or stem; omit for an index.")] = None,
    episode: Annotated[int | None, Opt(help="Only this episode.")] = None,
    turn: Annotated[int | None, Opt(help="Only this turn.")] = None,
    full: Annotated[bool, Opt(help="Do not shorten prompts, replies and kernels.")] = False,
    tree: Annotated[bool, Opt("--tree", help="Draw the search tree of --problem (of every problem without it): which turn continues which.")] = False,
) -> None:
    """A trajectory turn by turn: prompt, reply, kernel, verdict, feedback (--tree: the search tree)."""
    from kloop.agent.report.show import show

    console = make_console()
    try:
        shown = show(run_dir, console, problem, episode, turn, full, tree=tree)
    except RunDirError as e:
        raise _fail(str(e)) from None
    if problem is not None and shown == 0:
        raise _fail(f"no turns of {problem}" + (f" episode {episode}" if episode is not None else "") +
                    f" in {run_dir} (run `kloop show {run_dir}` for the index)")


def import_kernelbench_command(
    folder: Annotated[Path, typer.Argument(help="A KernelBench generations folder (level_L_problem_N_sample_S_kernel.py).")],
    out: Annotated[Path | None, Opt(help="The run directory to create (default: runs/import-<folder name>).")] = None,
    problems_dir: Annotated[Path | None, Opt(help="Problem folder for levels other than the bundled Level 3.")] = None,
    model: Annotated[str | None, Opt(help="Name of the model that wrote the kernels (default: from generation_config.yaml).")] = None,
) -> None:
    """Turn KernelBench kernels into a kloop run, to judge with `kloop replay RUN --rescore`."""
    from kloop.agent.interop import InteropError, import_kernelbench

    out = out or Path("runs") / f"import-{folder.resolve().name}"
    try:
        result = import_kernelbench(folder, out, problems_dir=problems_dir, model=model)
    except (InteropError, RunDirError) as e:
        raise _fail(str(e)) from None
    err.print(f"imported {result.kernels} kernel(s) for {len(result.problems)} problem(s) into {result.run_dir}")
    if result.ignored:
        err.print(f"ignored {len(result.ignored)} other file(s): {', '.join(result.ignored[:8])}"
                  + (" …" if len(result.ignored) > 8 else ""))
    err.print(f"next: kloop replay {result.run_dir} --rescore")


def export_command(
    run_dir: Annotated[Path, typer.Argument(help="A run directory.")],
    out: Annotated[Path | None, typer.Argument(help="Where to write: a folder (kernelbench) or a file (messages, parquet).")] = None,
    out_opt: Annotated[Path | None, Opt("--out", help="The same as OUT.")] = None,
    fmt: Annotated[str, Opt("--format", help="kernelbench: kernel files in KernelBench's layout; messages: JSONL training records (chat messages, verdict, speedup, reward); parquet: the same records as Parquet.")] = "kernelbench",
    per: Annotated[str, Opt(help="messages/parquet: one record per turn or per episode.")] = "turn",
    all_kernels: Annotated[bool, Opt("--all", help="kernelbench: every kernel of the run, not only each problem's best.")] = False,
    level: Annotated[int | None, Opt(help="kernelbench: level for problems whose id has none.")] = None,
) -> None:
    """Write a run's kernels in KernelBench's layout, or its turns as training data."""
    from kloop.agent.interop import InteropError, export_kernels
    from kloop.agent.report.load import ReportError

    target = out_opt or out
    if target is None:
        raise _fail("give where to write: OUT or --out")
    if fmt not in ("kernelbench", "messages", "parquet"):
        raise _fail(f"--format must be kernelbench, messages or parquet, not {fmt!r}")
    if per not in ("turn", "episode"):
        raise _fail(f"--per must be turn or episode, not {per!r}")
    if fmt != "kernelbench":
        from kloop.agent import export as training

        try:
            n = training.export(run_dir, target, fmt, per)  # type: ignore[arg-type]
        except RunDirError as e:
            raise _fail(str(e)) from None
        err.print(f"wrote {n} {per} record(s) to {target}")
        return
    try:
        written = export_kernels(run_dir, target, all_kernels=all_kernels, level=level)
    except (InteropError, ReportError, RunDirError) as e:
        raise _fail(str(e)) from None
    err.print(f"wrote {len(written)} kernel file(s) to {target}")


def register(app: typer.Typer) -> None:
    app.command("report")(report_command)
    app.command("show")(show_command)
    app.command("export")(export_command)
    import_app = typer.Typer(help="Bring kernels made elsewhere into kloop runs.", no_args_is_help=True)
    import_app.command("kernelbench")(import_kernelbench_command)
    app.add_typer(import_app, name="import")
