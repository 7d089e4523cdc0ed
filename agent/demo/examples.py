"""The bundled example runs and the `make demo` that reads them.

    python -m agent.demo.examples record [--device cuda]   # (re)write runs/examples/suite-*
    python -m agent.demo.examples demo [--out runs/demo]     # re-judge a sample, write the report

`record` runs the real `kloop run` twice over five problems of different families at a matched
budget of 4 LLM calls per problem: sequential refinement (1 episode x 4 turns, feedback between
turns) and best-of-4 (4 independent 1-turn episodes). The replies are the scripted kernels of
`agent/demo/kernels.py` (the runs say so); their token counts are counted over the recorded
text (`agent.tokens`), not provider-reported. Recorded on an H200 (`--device cuda`), the runs
keep its CUDA-event timings; recorded anywhere else, host-clock timings labelled as such.

`demo` re-judges a sample of the recorded kernels with the evaluator on the machine at hand
(the Triton CPU interpreter where there is no GPU), reports whether each verdict matches the
recorded one, and writes the comparison report of the two runs with the recorded numbers.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import yaml
from kloop.agent.demo.kernels import FAMILY, SIZES, Variant, reply
from pydantic import BaseModel, ConfigDict

DEMO_DIR = Path(__file__).resolve().parent
EXAMPLES = Path("runs/examples")
RUNS = {"sequential": "suite-sequential-1x4", "best_of_n": "suite-best-of-4x1"}

# What each strategy is given to try, per problem: the same 4 calls either way. Sequential gets
# feedback between its turns; best-of-4 draws 4 first attempts with none.
PLANS: dict[str, dict[str, list[Variant]]] = {
    "sequential": {
        "L3/1": ["syntax", "wrong", "ok", "ok_fast"],
        "L3/4": ["crash", "wrong", "ok", "ok_fast"],
        "L3/13": ["wrong", "ok", "ok_fast", "ok_fast"],
        "L3/17": ["syntax", "crash", "ok", "ok_fast"],
        "L3/43": ["wrong", "wrong", "ok", "ok_fast"],
    },
    "best_of_n": {
        "L3/1": ["wrong", "syntax", "ok", "crash"],
        "L3/4": ["crash", "wrong", "wrong", "syntax"],
        "L3/13": ["ok", "wrong", "ok_fast", "crash"],
        "L3/17": ["syntax", "crash", "wrong", "wrong"],
        "L3/43": ["wrong", "ok", "syntax", "wrong"],
    },
}
STRATEGY_LAYER = {"sequential": {"kind": "sequential", "turns": 4},
                  "best_of_n": {"kind": "best_of_n", "samples": 4}}
NOTE = ("Scripted replies written for kloop's bundled examples (agent/demo/kernels.py), not model "
        "output. Token usage is counted by kloop's own deterministic counter over the recorded "
        "text, not reported by a provider.")
SUITE_FILES = DEMO_DIR / "suite"


def write_scripts() -> dict[str, Path]:
    """The scripted-reply files of both strategies (committed; rewritten from kernels.py)."""
    SUITE_FILES.mkdir(exist_ok=True)
    paths = {}
    for strategy, plan in PLANS.items():
        # Addressed (problem, episode, turn): the runs may go at any concurrency.
        sequential = strategy == "sequential"
        replies = [{"at": {"problem": pid, "episode": 0 if sequential else i,
                           "turn": i + 1 if sequential else 1},
                    "text": reply(pid, v)}
                   for pid in SIZES for i, v in enumerate(plan[pid])]
        path = SUITE_FILES / f"{strategy}.yaml"
        path.write_text(f"# {NOTE}\n" + yaml.safe_dump(
            {"note": NOTE, "usage": "counted", "replies": replies}, sort_keys=False, width=100))
        paths[strategy] = path
    return paths


def record(device: str, concurrency: int = 1) -> None:
    """Run both strategies into runs/examples/ (replacing what is there). Concurrency changes
    only the wall time: timed work never overlaps (the device lock)."""
    import shutil

    from kloop.agent.cli import main

    for strategy, path in write_scripts().items():
        out = EXAMPLES / RUNS[strategy]
        shutil.rmtree(out, ignore_errors=True)
        args = ["run", "--model", f"scripted:{path.relative_to(Path.cwd())}", "--out", str(out),
                "--device", device, "--concurrency", str(concurrency)]
        for pid in SIZES:
            args += ["-p", pid]
        args += ["-c", f"problem_overrides={json.dumps(SIZES)}"]
        for k, v in STRATEGY_LAYER[strategy].items():
            args += ["-c", f"strategy.{k}={v}"]
        try:
            main(args)
        except SystemExit as e:
            if e.code:
                raise


class Rejudged(BaseModel):
    """One recorded kernel judged again on this machine."""

    model_config = ConfigDict(extra="forbid")

    problem_id: str
    family: str
    kernel: str
    recorded: str
    recorded_device: str
    recorded_runtime_ms: float | None
    recorded_clock: str | None
    now: str
    now_device: str
    now_runtime_ms: float | None
    match: bool
    seconds: float


def sample(run: Path) -> list:
    """Per problem: its best kernel and its first kernel that was not correct."""
    from kloop.agent.store import RunStore

    turns = RunStore.open(run).turns()
    picked = []
    for pid in SIZES:
        mine = [t for t in turns if t.problem_id == pid and t.code is not None and t.eval]
        correct = [t for t in mine if t.status == "correct"]
        if correct:
            picked.append(min(correct, key=lambda t: t.eval.runtime_ms or float("inf")))
        wrong = [t for t in mine if t.status not in ("correct",)]
        if wrong:
            picked.append(wrong[0])
    return picked


def rejudge(run: Path, device: str) -> list[Rejudged]:
    """Judge the sample again with today's evaluator on this machine (two at a time)."""
    from kloop.agent.components import build_evaluator, load_problems
    from kloop.agent.store import RunStore

    cfg = RunStore.open(run).config_record().config
    # No profiler pass: the verdict is what is compared, and it keeps the demo short.
    cfg = cfg.model_copy(update={"eval": cfg.eval.model_copy(update={"device": device, "profile": False})})
    problems = {p.id: p for p in load_problems(cfg)}
    evaluator = build_evaluator(cfg, list(problems.values()))

    def one(t) -> Rejudged:
        start = time.monotonic()
        result = evaluator.evaluate(problems[t.problem_id], t.code)
        rec = t.eval
        return Rejudged(
            problem_id=t.problem_id, family=FAMILY[t.problem_id], kernel=t.kernel_path,
            recorded=rec.status, recorded_device=rec.device, recorded_runtime_ms=rec.runtime_ms,
            recorded_clock=rec.timing.clock if rec.timing else None, now=result.status,
            now_device=result.device, now_runtime_ms=result.runtime_ms,
            match=result.status == rec.status, seconds=round(time.monotonic() - start, 1))

    with ThreadPoolExecutor(2) as pool:
        return list(pool.map(one, sample(run)))


def _ms(v: float | None) -> str:
    return "-" if v is None else f"{v:.3g} ms"


def demo(out: Path, device: str) -> int:
    """Re-judge a sample of the recorded kernels, then write the report of both runs."""
    from kloop.agent.cli import main

    start = time.monotonic()
    runs = [EXAMPLES / RUNS["sequential"], EXAMPLES / RUNS["best_of_n"]]
    out.mkdir(parents=True, exist_ok=True)
    print(f"re-judging a sample of {runs[0]} on this machine ({device})...", file=sys.stderr)
    checked = rejudge(runs[0], device)
    (out / "rejudge.json").write_text(json.dumps([c.model_dump() for c in checked], indent=2) + "\n")
    try:
        main(["report", *map(str, runs), "--out", str(out / "report")])
    except SystemExit as e:
        if e.code:
            raise
    write_summary(out, runs, checked)
    agree = sum(c.match for c in checked)
    print(f"verdicts re-judged here: {agree}/{len(checked)} match the recorded ones "
          f"({time.monotonic() - start:.0f} s)", file=sys.stderr)
    print(f"report: {out / 'demo.md'} (and {out / 'report' / 'report.md'})")
    return 0 if agree == len(checked) else 1


def write_summary(out: Path, runs: list[Path], checked: list[Rejudged]) -> None:
    from kloop.agent.store import RunStore

    lines = ["# kloop demo: sequential refinement vs best-of-4 at a matched budget", "",
             "Five KernelBench Level 3 problems of different families; each strategy gets 4 LLM",
             "calls per problem. Sequential refinement feeds the evaluator's verdict (compile",
             "errors, wrong-output diffs, timings) into the next turn; best-of-4 draws four",
             "independent first attempts. " + NOTE, ""]
    recorded_on, gpus, clocks = set(), set(), set()
    lines += ["## Recorded results", "",
              "| problem | family | sequential 1x4 | best-of-4 | calls | tokens (counted) |",
              "|---|---|---|---|---|---|"]
    stores = {s: RunStore.open(r) for s, r in zip(RUNS, runs, strict=True)}
    turns = {s: st.turns() for s, st in stores.items()}
    for pid in SIZES:
        cells = []
        for s in RUNS:
            mine = [t for t in turns[s] if t.problem_id == pid]
            recorded_on |= {t.eval.device for t in mine if t.eval}
            gpus |= {t.eval.env.device_name for t in mine if t.eval and t.eval.env}
            clocks |= {t.eval.timing.clock for t in mine if t.eval and t.eval.timing}
            best = [t for t in mine if t.status == "correct"]
            if best:
                b = min(best, key=lambda t: t.eval.runtime_ms or float("inf"))
                cells.append(f"correct (ep {b.episode} turn {b.turn}, {_ms(b.eval.runtime_ms)})")
            else:
                cells.append("none correct: " + ", ".join(t.status for t in mine))
        calls = {s: sum(t.spend.calls for t in turns[s] if t.problem_id == pid) for s in RUNS}
        toks = {s: sum(t.spend.total_tokens for t in turns[s] if t.problem_id == pid) for s in RUNS}
        lines.append(f"| {pid} | {FAMILY[pid]} | {cells[0]} | {cells[1]} | "
                     f"{calls['sequential']} / {calls['best_of_n']} | "
                     f"{toks['sequential']:,} / {toks['best_of_n']:,} |")
    gpu = any(d.startswith("cuda") for d in recorded_on)
    where = ", ".join(sorted(recorded_on)) + (f" ({', '.join(sorted(gpus))})" if gpu else "")
    lines += ["", f"Recorded on: {where}. " + (
        f"Runtimes are medians by kloop's {'/'.join(sorted(clocks))} clock on the recording "
        "GPU (the trusted side's clock, net of its handshake), kept in the records." if gpu else
        "Runtimes are host-clock medians of the Triton CPU interpreter: they show the pipeline, "
        "not GPU performance. **H200 numbers: not recorded yet** - on the H200 run "
        "`python -m agent.demo.examples record --device cuda` and commit runs/examples/suite-*; "
        "this page then shows them here, labelled as recorded GPU numbers."), ""]
    lines += ["## Re-judged on this machine", "",
              "| problem | kernel | recorded | now | match | recorded runtime | runtime now | s |",
              "|---|---|---|---|---|---|---|---|"]
    for c in checked:
        lines.append(f"| {c.problem_id} | {c.kernel} | {c.recorded} ({c.recorded_device}) | "
                     f"{c.now} ({c.now_device}) | {'yes' if c.match else '**NO**'} | "
                     f"{_ms(c.recorded_runtime_ms)} | {_ms(c.now_runtime_ms)} | {c.seconds} |")
    lines += ["", f"{sum(c.match for c in checked)}/{len(checked)} verdicts match. "
              "Runtimes measured here are host-clock numbers of this machine and are not compared.",
              "", "## Full report", "", "Metrics, budget curves and plots of both runs: "
              "[report/report.md](report/report.md)", ""]
    (out / "demo.md").write_text("\n".join(lines))


def cli(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m agent.demo.examples", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    rec = sub.add_parser("record", help="(re)write the example runs under runs/examples/")
    rec.add_argument("--device", default="auto")
    rec.add_argument("--concurrency", type=int, default=1)
    dem = sub.add_parser("demo", help="re-judge a sample and write the report")
    dem.add_argument("--out", type=Path, default=Path("runs/demo"))
    dem.add_argument("--device", default="auto")
    args = parser.parse_args(argv)
    if args.command == "record":
        record(args.device, args.concurrency)
        return 0
    return demo(args.out, args.device)


if __name__ == "__main__":
    sys.exit(cli())
