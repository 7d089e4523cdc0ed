"""`kloop eval` (one candidate) and `kloop baseline` (reference timings for a level).

`kloop eval --json` prints exactly one JSON object (the EvalResult) on stdout; logs go to stderr.
Exit status of `kloop eval`: 0 for `correct`, 1 for any other verdict, 2 for a usage error
(unreadable file, unknown problem or constant, bad option). Everything that needs no GPU is
checked before the reference runs. Nothing here imports torch until a command runs.
"""

from __future__ import annotations

import contextlib
import json
import logging
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

from kloop.console import make_console
from kloop.errors import KloopError
from kloop.evaluator.common.config import POLICIES, EvalConfig
from kloop.evaluator.common.result import EvalResult, TimingPlan, TimingStats
from kloop.evaluator.harness.precheck import (
    CandidateUnreadable,
    check_overrides,
    precheck_source,
    small_overrides,
)
from kloop.problems.registry import Problem, get_problem, load_problem_set

_STATUS_STYLE = {"correct": "bold green", "incorrect": "bold yellow", "not_run": "bold blue"}


class EvalCommandError(KloopError):
    """A `kloop eval` / `kloop baseline` that cannot run as asked (bad option, failed reference)."""


def _overrides(items: list[str]) -> dict[str, Any]:
    """`NAME=VALUE` pairs; VALUE is JSON when it parses (`2`, `[32, 32]`), else a string."""
    out: dict[str, Any] = {}
    for item in items:
        name, sep, value = item.partition("=")
        if not sep or not name.strip():
            raise EvalCommandError(f"--set expects NAME=VALUE, got {item!r}")
        try:
            out[name.strip()] = json.loads(value)
        except json.JSONDecodeError:
            out[name.strip()] = value
    return out


def _config(device: str, policy: str, overrides: dict[str, Any], keep: bool = False) -> EvalConfig:
    try:
        return EvalConfig(device=device, policy=policy, problem_overrides=overrides,
                          keep_workdir=keep)
    except ValueError as e:
        first = e.errors()[0]["msg"] if hasattr(e, "errors") else str(e)  # pydantic: no URL
        raise EvalCommandError(first.removeprefix("Value error, ")) from None


def small_on_gpu(size: str | None, device: str) -> str | None:
    """The warning `--size small` on a GPU deserves: such sizes run in microseconds, below the
    clock's resolution (`harness.timed.RESOLUTION_MULTIPLE`), and their results say so."""
    if size != "small" or device == "cpu":
        return None
    import torch

    if not torch.cuda.is_available():
        return None
    return ("warning: --size small on a GPU makes models of microseconds, below what the "
            "harness clock resolves; their results are flagged below_clock_resolution and their "
            "speedups mean little. Judge at full size for numbers.")


def problem_overrides(problem: Problem, size: str, items: list[str]) -> dict[str, Any]:
    """`--size small` constants, then `--set` ones; names checked against the problem file."""
    if size not in ("full", "small"):
        raise EvalCommandError(f"--size must be full or small, not {size!r}")
    out = small_overrides(problem.source) if size == "small" else {}
    given = _overrides(items)
    check_overrides(problem.source, given, f"--set for {problem.id}")
    return {**out, **given}


def read_candidate(path: Path) -> str:
    """The candidate's text; a file that cannot be read or is not UTF-8 is a usage error."""
    try:
        data = path.read_bytes()
    except OSError as e:
        raise CandidateUnreadable(f"cannot read {path}: {e.strerror or e}") from None
    bad = precheck_source(data)
    if bad is not None and bad.kind == "not_utf8":
        raise CandidateUnreadable(f"{path}: {bad.message}; save the candidate as UTF-8")
    return data.decode("utf-8")


@contextlib.contextmanager
def stage_line(label: str, enabled: bool) -> Iterator[Callable[[str], None]]:
    """A live `label: stage (elapsed)` line on a terminal; nothing at all when piped."""
    err = make_console(stderr=True)
    if not (enabled and err.is_terminal):
        yield lambda stage: None
        return
    current = ["starting"]
    start = time.monotonic()
    with err.status(f"{label}: starting") as status:
        stop = threading.Event()

        def tick() -> None:
            while not stop.wait(0.25):
                status.update(f"{label}: {current[0]} ({time.monotonic() - start:.0f} s)")

        thread = threading.Thread(target=tick, daemon=True)
        thread.start()
        try:
            yield lambda stage: current.__setitem__(0, stage)
        finally:
            stop.set()
            thread.join()


@contextlib.contextmanager
def announced_stages(announce: Callable[[str], None]) -> Iterator[None]:
    """Report each pipeline stage by name while it runs (the pipeline has no progress hook)."""
    from kloop.evaluator.harness import pipeline

    stages = getattr(pipeline, "STAGES", None)
    if stages is None:  # a pipeline without a stage table: the line shows elapsed time only
        yield
        return

    def wrap(stage: Callable) -> Callable:
        def run(*args: Any, **kwargs: Any) -> Any:
            announce(stage.__name__.removesuffix("_stage"))
            return stage(*args, **kwargs)
        return run

    pipeline.STAGES = tuple(wrap(s) for s in stages)
    try:
        yield
    finally:
        pipeline.STAGES = stages


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
    size: Annotated[str, typer.Option(help="full, or small: every size constant shrunk for CPU use.")] = "full",
) -> None:
    """Evaluate one candidate against a reference problem in isolated processes.

    Exit status: 0 when the verdict is `correct`, 1 for any other verdict, 2 for a usage error.
    """
    source = read_candidate(candidate)
    prob = get_problem(problem, problems_dir)
    config = _config(device, policy, problem_overrides(prob, size, set_ or []), keep_workdir)
    if (warning := small_on_gpu(size, device)) is not None:
        print(warning, file=sys.stderr)
    result = _evaluate(prob, source, config, progress=not as_json)
    if as_json:
        sys.stdout.write(result.model_dump_json() + "\n")
    else:
        render(result, make_console())
    if result.status != "correct":
        raise typer.Exit(1)


def _evaluate(prob: Problem, source: str, config: EvalConfig, progress: bool) -> EvalResult:
    from kloop.evaluator.harness.pipeline import evaluate
    from kloop.evaluator.harness.reference import ReferenceFailure

    logging.basicConfig(stream=sys.stderr, level=logging.WARNING)
    with stage_line(f"kloop eval {prob.id}", progress) as announce, announced_stages(announce):
        try:
            return evaluate(prob, source, config)
        except (ReferenceFailure, RuntimeError) as e:
            raise EvalCommandError(f"evaluation could not run: {e}") from None


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
    size: Annotated[str, typer.Option(help="full, or small: every size constant shrunk for CPU use.")] = "full",
    concurrency: Annotated[int, typer.Option(
        min=1, help="Problems at once (their timings still take the GPU one at a time).")] = 1,
) -> None:
    """Time the eager and torch.compile baselines (default and reduce-overhead modes) of a level's
    references (cached on disk): the warm-up before a long run."""
    from kloop.evaluator.tools.warmup import warm_up

    logging.basicConfig(stream=sys.stderr, level=logging.WARNING)
    pset = load_problem_set(problems_dir)
    probs = [pset.get(p) for p in problem] if problem else pset.filter(level)
    if not probs:
        raise EvalCommandError("no problems chosen: give --level N or --problem ID")
    configs = {p.id: _config(device, policy, problem_overrides(p, size, set_ or [])) for p in probs}
    console = make_console()
    first = configs[probs[0].id]
    done = iter(range(1, len(probs) + 1))
    lock = threading.Lock()

    def progress(w) -> None:
        with lock:
            print(f"kloop baseline {w.problem_id} ({next(done)}/{len(probs)}) "
                  f"{'failed' if w.error else 'timed'} in {w.seconds:.1f} s", file=sys.stderr,
                  flush=True)

    warmed, wall = warm_up([(p, configs[p.id]) for p in probs], concurrency,
                           rebuild=not use_cache, on_done=progress)
    table = Table(title=f"baselines ({first.policy}, {first.device})")
    for col in ("problem", "eager median ms", "compile median ms", "reduce-overhead median ms",
                "seconds", "note"):
        table.add_column(col)
    for w in warmed:
        out = w.reference
        if out is None:
            table.add_row(w.problem_id, "-", "-", "-", f"{w.seconds:.1f}",
                          (w.error or "").splitlines()[0][:80])
            continue
        table.add_row(w.problem_id, _ms(out.eager), _ms(out.compiled), _ms(out.compiled_ro),
                      f"{w.seconds:.1f}", " ".join(out.flags)[:80])
    console.print(table)
    console.print(f"{len(probs)} problems' baselines in {wall:.1f} s, {concurrency} at once "
                  f"({'cached ones kept' if use_cache else 'every one timed again'})")


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
                                ("torch.compile", r.compiled),
                                ("torch.compile reduce-overhead", r.compiled_ro)) if t]
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
    if r.speedup_vs_best is not None:
        console.print(f"speedup vs eager {_num(r.speedup_vs_eager)}x, "
                      f"vs torch.compile {_num(r.speedup_vs_compile)}x, "
                      f"vs reduce-overhead {_num(r.speedup_vs_compile_ro)}x; "
                      f"vs the fastest ({r.best_baseline}) {_num(r.speedup_vs_best)}x")
    if r.speedup_ci:
        console.print("95 % intervals: " + ", ".join(
            f"{name} [{_num(ci.low)}, {_num(ci.high)}]" for name, ci in r.speedup_ci.items()))
    if r.paired is not None:
        calls = r.paired.rounds * r.paired.calls_per_round
        early = " (the sequential rule stopped after the first half: every interval was " \
            "narrow)" if r.paired.stopped_early else ""
        console.print(f"{calls} timed calls a side in {r.paired.rounds} paired rounds{early}"
                      f"{_plan_note(r.paired.plan)}")


def _plan_note(plan: TimingPlan | None) -> str:
    """Why the count is what it is (`harness.budget`)."""
    if plan is None or plan.calls == plan.full:
        return ""
    return (f" (the budget's count: {plan.budget_ms:g} ms a side at {plan.eager_ms:.3g} ms an "
            f"eager call, from the {plan.source.replace('_', ' ')}; {plan.full} without it)")


def _num(x: float | None) -> str:
    return f"{x:.3g}" if x is not None else "-"


def check_command(
    device: Annotated[str, typer.Option(help="auto, cuda, cuda:N or cpu.")] = "auto",
    as_json: Annotated[bool, typer.Option("--json", help="One JSON array on stdout.")] = False,
    run_probe: Annotated[bool, typer.Option(
        "--probe/--no-probe", help="Also evaluate a probe that reports what candidate code "
        "sees from inside (about 10 s).")] = True,
) -> None:
    """What isolation and measurement this machine gives the evaluator. Exit 0 when every
    isolation row holds (results free of isolation_same_uid), 1 when one does not."""
    from kloop.evaluator.tools.trustcheck import probe, rows

    config = _config(device, "strict", {})
    found = rows(config, get_problem("L3/1").path)
    if run_probe:
        logging.basicConfig(stream=sys.stderr, level=logging.WARNING)
        with stage_line("kloop check: probing the sandbox", not as_json):
            found += probe(config.model_copy(update={
                "problem_overrides": problem_overrides(get_problem("L3/1"), "small", [])}))
    if as_json:
        typer.echo(json.dumps([r.model_dump() for r in found]))
    else:
        table = Table(title="kloop check")
        for col in ("", "what", "isolation", "detail"):
            table.add_column(col)
        for r in found:
            mark = {True: "[green]ok[/green]", False: "[red]no[/red]", None: "-"}[r.ok]
            table.add_row(mark, r.name, "yes" if r.trust else "", r.detail)
        make_console().print(table)
    raise typer.Exit(0 if all(r.ok for r in found if r.trust) else 1)


def register(app: typer.Typer) -> None:
    app.command("eval")(eval_command)
    app.command("baseline")(baseline_command)
    app.command("check")(check_command)

