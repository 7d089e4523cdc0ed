"""KernelBench interop: import a generations folder as a kloop run, export a run's kernels.

KernelBench's `generate_samples.py` writes `level_<L>_problem_<id>_sample_<s>_kernel.py`, one
file per (problem, sample), and a `generation_config.yaml`. Import turns each file into a
one-turn episode of a new run directory, ready for `kloop replay RUN --rescore`, which judges
the kernels with kloop's evaluator.

What an imported turn holds (nothing is invented):
- `code`, `code_sha256`, `kernel_path`: the file, byte for byte.
- `messages = []` and `reply.text = ""`: KernelBench keeps neither the prompt nor the reply.
- `reply.usage = None`, `reply.cost_usd = None`,
  `spend = {calls: 1, unpriced_calls: 1, unmetered_calls: 1}`: one
  generation call happened, its tokens and cost are unknown (reports mark those axes unknown).
- `reply.raw = {"kloop_import": {...}}`: where the file came from (the marker reports look for).
- `eval = None` until rescored (reported as `unevaluated`); the episode stops with `max_turns`.

Export writes, for each problem, the best kernel (`agent.tally.best_turn`) as sample 0 in the
same layout, or with `all_kernels` every kernel of the run, plus `kloop_export.json`.
"""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path

import yaml
from kloop.agent.budget import Spend
from kloop.agent.config import ConfigError, RunConfig, resolve
from kloop.agent.episode import episode_key
from kloop.agent.models.base import ModelReply
from kloop.agent.records import EpisodeRecord, TurnRecord, utcnow
from kloop.agent.report.load import IMPORT_MARKER, load_run
from kloop.agent.report.metrics import problem_rows
from kloop.agent.store import RunStore
from kloop.agent.strategies import summarize
from kloop.problems.registry import Problem, ProblemError, load_problem_set
from pydantic import BaseModel, ConfigDict

from kloop.errors import KloopError

KB_NAME = re.compile(r"^level_(\d+)_problem_(\d+)_sample_(\d+)_kernel\.py$")
EXPORT_MANIFEST = "kloop_export.json"


class InteropError(KloopError, ValueError):
    """A folder or run that cannot be imported or exported as asked; says which file and why."""


class ImportResult(BaseModel):
    model_config = ConfigDict(extra="forbid")

    run_dir: str
    kernels: int
    problems: list[str]
    ignored: list[str]
    """Files in the folder that are not KernelBench kernel files."""


def kernelbench_name(level: int, number: int, sample: int) -> str:
    return f"level_{level}_problem_{number}_sample_{sample}_kernel.py"


def _scan(src: Path) -> tuple[dict[tuple[int, int, int], Path], list[str]]:
    if not src.is_dir():
        raise InteropError(f"{src} is not a folder")
    found, ignored = {}, []
    for f in sorted(src.iterdir()):
        m = KB_NAME.match(f.name)
        if m and f.is_file():
            found[(int(m.group(1)), int(m.group(2)), int(m.group(3)))] = f
        else:
            ignored.append(f.name)
    if not found:
        raise InteropError(f"{src}: no level_<L>_problem_<id>_sample_<s>_kernel.py files")
    return found, ignored


def _generation_model(src: Path) -> str:
    """The model KernelBench says it used (generation_config.yaml), else `unknown`."""
    cfg = src / "generation_config.yaml"
    if not cfg.is_file():
        return "unknown"
    try:
        data = yaml.safe_load(cfg.read_text())
    except yaml.YAMLError:
        return "unknown"
    return str(data.get("model_name") or "unknown") if isinstance(data, dict) else "unknown"


def _resolve_problems(keys, problems_dir: Path | None) -> dict[tuple[int, int], Problem]:
    try:
        pset = load_problem_set(problems_dir)
    except ProblemError as e:
        raise InteropError(str(e)) from None
    out, unknown = {}, []
    for level, number in sorted({(lv, n) for lv, n, _ in keys}):
        hits = [p for p in pset if p.number == number and (p.level == level or p.level is None)]
        if len(hits) == 1:
            out[(level, number)] = hits[0]
        else:
            unknown.append(f"level {level} problem {number}")
    if unknown:
        raise InteropError(f"no matching problem in {pset.root} for: {', '.join(unknown)} "
                           "(give --problems-dir for other levels)")
    return out


def _exported_overrides(src: Path) -> dict:
    """Problem size overrides recorded by `kloop export` in the folder's manifest, if any."""
    path = src / EXPORT_MANIFEST
    if not path.is_file():
        return {}
    try:
        data = json.loads(path.read_text())
    except ValueError as e:
        raise InteropError(f"{path}: not valid JSON: {e}") from None
    return data.get("problem_overrides") or {} if isinstance(data, dict) else {}


def _backend(codes: list[str]) -> str:
    triton = sum("import triton" in c or "@triton.jit" in c for c in codes)
    return "triton" if triton > len(codes) / 2 else "cuda"


def import_kernelbench(src: Path, out: Path, problems_dir: Path | None = None,
                       model: str | None = None) -> ImportResult:
    """Turn a KernelBench generations folder into a new kloop run directory at `out`."""
    src = Path(src)
    files, ignored = _scan(src)
    problems = _resolve_problems(files.keys(), problems_dir)
    try:
        codes = {k: f.read_text(encoding="utf-8") for k, f in files.items()}
    except UnicodeDecodeError as e:
        raise InteropError(f"{src}: a kernel file is not UTF-8 text: {e}") from None
    name = model or _generation_model(src)
    samples = max(s for _, _, s in files) + 1
    try:
        cfg: RunConfig = resolve([{
            "problems": [p.id for p in problems.values()], "problems_dir": str(problems_dir) if problems_dir else None,
            "model": {"spec": f"kernelbench-import:{name}"}, "concurrency": 1,
            "agent": {"backend": _backend(list(codes.values()))},
            "strategy": {"kind": "best_of_n", "samples": samples, "turns": 1},
            "problem_overrides": _exported_overrides(src),
            "runs_dir": str(Path(out).parent), "run_id": Path(out).name}])
    except ConfigError as e:
        raise InteropError(str(e)) from None
    store = RunStore.create(Path(out), cfg, source_run=str(src.resolve()))
    digest, now = cfg.digest(), utcnow()
    turns: dict[str, list[TurnRecord]] = {}
    records = []
    for (level, number, sample), path in sorted(files.items()):
        problem, code = problems[(level, number)], codes[(level, number, sample)]
        key = episode_key(problem.sha256, digest, f"sample={sample}")
        provenance = {"format": "kernelbench", "file": path.name, "folder": str(src.resolve())}
        reply = ModelReply(text="", usage=None, cost_usd=None, finish_reason=None, latency_s=0.0,
                           model=name, raw={IMPORT_MARKER: provenance})
        spend = Spend.of_reply(reply)
        rec = TurnRecord(run_id=store.run_id, episode_key=key, episode=sample, problem_id=problem.id,
                         problem_stem=problem.stem, turn=1, messages=[], reply=reply, code=code,
                         code_sha256=hashlib.sha256(code.encode()).hexdigest(),
                         kernel_path=store.kernel_relpath(problem.stem, sample, 1), feedback="",
                         spend=spend, started_at=now, finished_at=now)
        store.append_turn(rec)
        ep = EpisodeRecord(run_id=store.run_id, episode_key=key, episode=sample, problem_id=problem.id,
                           problem_stem=problem.stem, problem_sha256=problem.sha256, sample=sample,
                           turns=1, statuses=["unevaluated"], stop_reason="max_turns",
                           stop_detail=f"imported from {path.name}; not evaluated (kloop replay --rescore)",
                           spend=spend, started_at=now, finished_at=now)
        store.append_episode(ep)
        turns[key] = [rec]
        records.append(ep)
    store.write_summary(summarize(store.run_id, turns, records, {}, "finished"))
    return ImportResult(run_dir=str(out), kernels=len(files), problems=[p.id for p in problems.values()],
                        ignored=ignored)


class ExportedKernel(BaseModel):
    model_config = ConfigDict(extra="forbid")

    file: str
    problem_id: str
    episode: int
    turn: int
    status: str
    speedup_vs_eager: float | None = None
    speedup_vs_compile: float | None = None


def _level_number(problem_id: str, stem: str, level: int | None) -> tuple[int, int]:
    m = re.fullmatch(r"L(\d+)/(\d+)", problem_id)
    if m:
        return int(m.group(1)), int(m.group(2))
    n = re.match(r"(\d+)_", stem)
    if n and level is not None:
        return level, int(n.group(1))
    raise InteropError(f"{problem_id}: cannot tell its KernelBench level and number (give --level)")


def _read_kernel(run_dir: Path, kernel_path: str | None, code: str | None, sha: str | None) -> str:
    path = run_dir / kernel_path if kernel_path else None
    text = path.read_text() if path is not None and path.is_file() else code
    if text is None:
        raise InteropError(f"{run_dir}: kernel {kernel_path} is missing")
    if sha is not None and hashlib.sha256(text.encode()).hexdigest() != sha:
        raise InteropError(f"{path}: the file no longer matches the sha256 its turn recorded")
    return text


def export_kernels(run_dir: Path, out: Path, all_kernels: bool = False, level: int | None = None) -> list[ExportedKernel]:
    """Write a run's kernels into `out` in KernelBench's layout; returns what was written."""
    run = load_run(Path(run_dir))
    out.mkdir(parents=True, exist_ok=True)
    exported: list[ExportedKernel] = []
    if all_kernels:
        by_problem: dict[str, list[TurnRecord]] = {}
        for t in run.turns:
            if t.code is not None:
                by_problem.setdefault(t.problem_id, []).append(t)
        for ts in by_problem.values():
            ts.sort(key=lambda t: (t.episode, t.turn))
            one_per_episode = len({t.episode for t in ts}) == len(ts)
            for i, t in enumerate(ts):
                lv, num = _level_number(t.problem_id, t.problem_stem, level)
                name = kernelbench_name(lv, num, t.episode if one_per_episode else i)
                (out / name).write_text(_read_kernel(run.path, t.kernel_path, t.code, t.code_sha256))
                exported.append(ExportedKernel(
                    file=name, problem_id=t.problem_id, episode=t.episode, turn=t.turn,
                    status=t.eval.status if t.eval else "unevaluated",
                    speedup_vs_eager=t.eval.speedup_vs_eager if t.eval else None,
                    speedup_vs_compile=t.eval.speedup_vs_compile if t.eval else None))
    else:
        for row in problem_rows(run):
            if not row.correct or row.best_episode is None or row.best_turn is None:
                continue
            lv, num = _level_number(row.problem_id, row.stem, level)
            name = kernelbench_name(lv, num, 0)
            (out / name).write_text(_read_kernel(run.path, row.kernel_path, None, row.code_sha256))
            exported.append(ExportedKernel(
                file=name, problem_id=row.problem_id, episode=row.best_episode, turn=row.best_turn,
                status="correct", speedup_vs_eager=row.speedup_vs_eager, speedup_vs_compile=row.speedup_vs_compile))
    # The sizes the kernels were judged at travel with them, so `import` judges them alike.
    manifest = {"source_run": str(run.path), "run_id": run.record.run_id, "all_kernels": all_kernels,
                "problem_overrides": run.record.config.problem_overrides,
                "kernels": [k.model_dump() for k in exported]}
    (out / EXPORT_MANIFEST).write_text(json.dumps(manifest, indent=1) + "\n")
    return exported
