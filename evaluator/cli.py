"""`kloop eval` (one candidate) and `kloop baseline` (reference timings for a level).

`kloop eval --json` prints exactly one JSON object (the EvalResult) on stdout; logs go to stderr.
"""

from __future__ import annotations

import json
import logging
import sys
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

from evaluator.config import POLICIES, EvalConfig
from evaluator.reference import ReferenceFailure
from evaluator.result import EvalResult, TimingStats
from problems.registry import ProblemError, get_problem, load_problem_set

_STATUS_STYLE = {"correct": "bold green", "incorrect": "bold yellow", "not_run": "bold blue"}


def _overrides(items: list[str]) -> dict[str, Any]:
    """`NAME=VALUE` pairs; VALUE is JSON when it parses (`2`, `[32, 32]`), else a string."""
    out: dict[str, Any] = {}
    for item in items:
        name, sep, value = item.partition("=")
        if not sep or not name.strip():
            raise typer.BadParameter(f"--set expects NAME=VALUE, got {item!r}")
        try:
            out[name.strip()] = json.loads(value)
        except json.JSONDecodeError:
            out[name.strip()] = value
    return out


def _config(device: str, policy: str, overrides: list[str], keep: bool = False) -> EvalConfig:
    try:
        return EvalConfig(device=device, policy=policy, problem_overrides=_overrides(overrides),
                          keep_workdir=keep)
    except ValueError as e:
        raise typer.BadParameter(str(e)) from None


def eval_command(
    candidate: Annotated[Path, typer.Argument(help="Python file defining ModelNew.")],
    problem: Annotated[str, typer.Option("--problem", "-p", help="Problem id, e.g. L3/4.")],
    device: Annotated[str, typer.Option(help="auto, cuda, cuda:N or cpu.")] = "auto",
    policy: Annotated[str, typer.Option(help=f"One of: {', '.join(POLICIES)}.")] = "strict",
    set_: Annotated[list[str] | None, typer.Option(
        "--set", help="Override a problem constant, e.g. --set batch_size=2 (repeatable).")] = None,
    problems_dir: Annotated[Path | None, typer.Option(help="A KernelBench-format folder.")] = None,
    keep_workdir: Annotated[bool, typer.Option(help="Keep the temporary directories.")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print only the EvalResult JSON.")] = False,
) -> None:
    """Evaluate one candidate against a reference problem in isolated processes."""
    from evaluator.pipeline import evaluate

    logging.basicConfig(stream=sys.stderr, level=logging.INFO if not as_json else logging.WARNING)
    try:
        source = candidate.read_text()
    except OSError as e:
        raise typer.BadParameter(f"cannot read {candidate}: {e}") from None
    try:
        prob = get_problem(problem, problems_dir)
    except ProblemError as e:
        raise typer.BadParameter(str(e)) from None
    config = _config(device, policy, set_ or [], keep_workdir)
    try:
        result = evaluate(prob, source, config)
    except (ReferenceFailure, RuntimeError) as e:
        typer.echo(f"evaluation could not run: {e}", err=True)
        raise typer.Exit(2) from None
    if as_json:
        sys.stdout.write(result.model_dump_json() + "\n")
        return
    render(result, Console())


def baseline_command(
    level: Annotated[int | None, typer.Option(help="Every problem of this level.")] = None,
    problem: Annotated[list[str] | None, typer.Option(
        "--problem", "-p", help="Only these problems (repeatable).")] = None,
    device: Annotated[str, typer.Option(help="auto, cuda, cuda:N or cpu.")] = "auto",
    policy: Annotated[str, typer.Option(help=f"One of: {', '.join(POLICIES)}.")] = "strict",
    set_: Annotated[list[str] | None, typer.Option("--set", help="NAME=VALUE override.")] = None,
    problems_dir: Annotated[Path | None, typer.Option(help="A KernelBench-format folder.")] = None,
    use_cache: Annotated[bool, typer.Option(
        "--use-cache/--rebuild", help="Keep cached timings (default: time again).")] = False,
) -> None:
    """Time the eager and torch.compile baselines of a level's references (cached on disk)."""
    from evaluator.pipeline import build_baselines

    logging.basicConfig(stream=sys.stderr, level=logging.INFO)
    try:
        pset = load_problem_set(problems_dir)
        probs = [pset.get(p) for p in problem] if problem else pset.filter(level)
    except ProblemError as e:
        raise typer.BadParameter(str(e)) from None
    config = _config(device, policy, set_ or [])
    console = Console()
    table = Table(title=f"baselines ({config.policy}, {config.device})")
    for col in ("problem", "eager median ms", "compile median ms", "note"):
        table.add_column(col)
    for prob in probs:
        try:
            out = build_baselines(prob, config, rebuild=not use_cache)
        except ReferenceFailure as e:
            table.add_row(prob.id, "-", "-", str(e).splitlines()[0][:80])
            continue
        table.add_row(prob.id, _ms(out.eager), _ms(out.compiled), " ".join(out.flags)[:80])
    console.print(table)


def _ms(t: TimingStats | None) -> str:
    return f"{t.median_ms:.4g}" if t else "-"


def render(r: EvalResult, console: Console) -> None:
    """A readable summary of one result."""
    style = _STATUS_STYLE.get(r.status, "bold red")
    console.print(f"[{style}]{r.status}[/{style}]  {r.problem_id}  backend={r.backend}  "
                  f"custom kernel={r.has_custom_kernel}  stage={r.stage_reached}  "
                  f"policy={r.policy}  device={r.device}")
    if r.error:
        console.print(f"[red]{r.error.type}[/red]: {r.error.message}")
        for text in (r.error.traceback, r.error.stderr_tail):
            if text:
                console.print("\n".join(text.strip().splitlines()[-15:]), markup=False)
    if r.compile and r.compile.diagnostics:
        for d in r.compile.diagnostics[:8]:
            console.print(f"  {d.severity} {d.file or '?'}:{d.line or '?'}: {d.message}"
                          + (f" (x{d.count})" if d.count > 1 else ""), markup=False)
    if r.correctness:
        table = Table(title="correctness")
        for col in ("trial", "kind", "ok", "max abs", "max rel", "mismatch", "note"):
            table.add_column(col)
        for t in r.correctness:
            d = next((o for o in t.outputs if not o.ok), t.outputs[0] if t.outputs else None)
            table.add_row(str(t.trial), t.kind, "yes" if t.passed else "NO",
                          _num(d.max_abs_err if d else None), _num(d.max_rel_err if d else None),
                          f"{d.mismatch_fraction:.2%}" if d and d.mismatch_fraction is not None
                          else "-", (t.message or "")[:60])
        console.print(table)
    _render_timing(r, console)
    if r.profile and r.profile.text:
        console.print(r.profile.text, markup=False)
    for v in r.violations:
        console.print(f"[magenta]{v.severity}[/magenta] {v.rule}: {v.message}")
    if r.flags:
        console.print("flags: " + ", ".join(r.flags), markup=False)
    console.print("stage seconds: " + ", ".join(f"{k}={v:.2f}" for k, v in
                                                  r.stage_seconds.items()))


def _render_timing(r: EvalResult, console: Console) -> None:
    rows = [(n, t) for n, t in (("candidate", r.timing), ("eager", r.eager),
                                ("torch.compile", r.compiled)) if t]
    if not rows:
        return
    table = Table(title="timing (ms)" + ("" if rows[0][1].comparable else
                                          ", host clock: not comparable with GPU numbers"))
    for col in ("", "median", "mean", "std", "min", "max", "IQR", "n"):
        table.add_column(col)
    for name, t in rows:
        table.add_row(name, *(f"{x:.4g}" for x in (t.median_ms, t.mean_ms, t.std_ms, t.min_ms,
                                                   t.max_ms, t.iqr_ms)), str(t.n_trials))
    console.print(table)
    if r.speedup_vs_eager or r.speedup_vs_compile:
        console.print(f"speedup vs eager {_num(r.speedup_vs_eager)}x, "
                      f"vs torch.compile {_num(r.speedup_vs_compile)}x")


def _num(x: float | None) -> str:
    return f"{x:.3g}" if x is not None else "-"


def register(app: typer.Typer) -> None:
    app.command("eval")(eval_command)
    app.command("baseline")(baseline_command)

