"""The run directory: the durable, append-only record of a run.

    runs/<run-id>/
      config.json       the resolved config, its digest, the kloop version and git commit
      turns.jsonl       one TurnRecord per line, appended, flushed and fsynced after each turn
      episodes.jsonl    one EpisodeRecord per finished episode (the last record of a key wins)
      calls.jsonl       every model call of a turn or agent step (CallRecord): logged before it
                        is sent and when it ends; an agent's reply before its tool runs
      kernels/<problem-stem>/<episode>-<turn>.py   every extracted kernel
      best/<problem-stem>.py                      the best kernel so far (derived)
      summary.json      derived from the JSONL files; rewritten as the run advances

A crash can leave a truncated last line: reading ignores it with a warning, and opening the
file for appending first cuts it back to the last complete line. A damaged line anywhere else
is an error: nothing is silently dropped.
"""

from __future__ import annotations

import logging
import os
import re
import subprocess
import threading
from collections.abc import Iterator
from importlib import metadata
from pathlib import Path
from typing import Literal, TypeVar

from pydantic import BaseModel, ConfigDict, ValidationError, field_validator

from kloop.agent.config import RunConfig, saved_config
from kloop.agent.records import (
    TRAJECTORY_SCHEMA_VERSION,
    CallRecord,
    EpisodeRecord,
    NodeAddress,
    RunSummary,
    TurnRecord,
    utcnow,
)
from kloop.errors import KloopError

log = logging.getLogger(__name__)
R = TypeVar("R", bound=BaseModel)


class RunDirError(KloopError, ValueError):
    """A run directory that cannot be used as asked (missing, damaged, already exists)."""


class RunConfigRecord(BaseModel):
    """Contents of `config.json`."""

    model_config = ConfigDict(extra="forbid")

    schema_version: int = TRAJECTORY_SCHEMA_VERSION
    run_id: str
    created_at: str
    kloop_version: str
    git_commit: str | None
    digest: str
    """`RunConfig.digest()`: part of every episode key."""
    kind: Literal["run", "replay", "rescore", "fork"] = "run"
    source_run: str | None = None
    """For replays, rescores and forks: the run directory they were made from."""
    fork_at: int | NodeAddress | None = None
    """For forks: the source turn after which each episode continues, or the one node continued."""
    config: RunConfig

    @field_validator("config", mode="before")
    @classmethod
    def _as_saved(cls, v: object) -> object:
        return saved_config(v)  # written before evaluator settings were removed: still read


def kloop_version() -> str:
    try:
        return metadata.version("kloop")
    except metadata.PackageNotFoundError:
        return "unknown"


def git_commit() -> str | None:
    """The commit of the kloop checkout (with `+dirty` for local changes), None outside git."""
    repo = Path(__file__).resolve().parent.parent
    try:
        head = subprocess.run(["git", "rev-parse", "--verify", "-q", "HEAD"], cwd=repo,
                              capture_output=True, text=True, timeout=10)
        if head.returncode != 0:
            return None
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=repo,
                               capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return head.stdout.strip() + ("+dirty" if dirty.stdout.strip() else "")


def _repair_tail(path: Path) -> None:
    """Cut a file back to its last complete line (a crash may have left half a line)."""
    if not path.exists():
        return
    with path.open("rb+") as f:
        data = f.read()
        if not data or data.endswith(b"\n"):
            return
        keep = data.rfind(b"\n") + 1
        log.warning("%s: dropping a truncated last line (%d bytes) left by an interrupted run",
                    path, len(data) - keep)
        f.truncate(keep)


_VERSION_RE = re.compile(rb'"schema_version"\s*:\s*(\d+)')


def check_schema(path: Path, text: str | bytes, number: int | None = None) -> None:
    """Refuse a record written by a newer kloop (its fields may mean something else)."""
    raw = text.encode() if isinstance(text, str) else text
    found = _VERSION_RE.search(raw)
    if found is not None and int(found.group(1)) > TRAJECTORY_SCHEMA_VERSION:
        where = f"{path}:{number}" if number is not None else str(path)
        raise RunDirError(f"{where}: schema_version {int(found.group(1))} is newer than this "
                          f"kloop reads ({TRAJECTORY_SCHEMA_VERSION}); upgrade kloop to read it")


def read_jsonl(path: Path, model: type[R]) -> Iterator[R]:
    """Records of a JSONL file; a truncated last line is skipped with a warning."""
    if not path.exists():
        return
    lines = path.read_bytes().split(b"\n")
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        check_schema(path, line, number)
        try:
            yield model.model_validate_json(line)
        except ValidationError as e:
            if number == len(lines):
                log.warning("%s: ignoring a truncated last line (%d bytes)", path, len(line))
                return
            raise RunDirError(f"{path}:{number}: not a valid {model.__name__}: {e}") from None


class RunStore:
    """Reads and appends the files of one run directory; safe to share between threads."""

    def __init__(self, root: Path):
        self.root = Path(root)
        self._lock = threading.Lock()
        self._repaired = False

    @property
    def run_id(self) -> str:
        return self.root.name

    @classmethod
    def create(cls, root: Path, config: RunConfig, *, kind: str = "run",
               source_run: str | None = None, fork_at: int | NodeAddress | None = None) -> RunStore:
        root = Path(root)
        if root.exists() and any(root.iterdir()):
            raise RunDirError(f"{root} already exists; resume it with --resume {root}, or pick another run id")
        root.mkdir(parents=True, exist_ok=True)
        record = RunConfigRecord(
            run_id=root.name, created_at=utcnow(), kloop_version=kloop_version(),
            git_commit=git_commit(), digest=config.digest(), kind=kind, source_run=source_run,
            fork_at=fork_at, config=config,
        )
        (root / "config.json").write_text(record.model_dump_json(indent=2) + "\n")
        return cls(root)

    @classmethod
    def open(cls, root: Path) -> RunStore:
        store = cls(Path(root))
        if not (store.root / "config.json").is_file():
            raise RunDirError(f"{root} is not a run directory (no config.json)")
        return store

    def config_record(self) -> RunConfigRecord:
        path = self.root / "config.json"
        text = path.read_text()
        check_schema(path, text)
        try:
            return RunConfigRecord.model_validate_json(text)
        except ValidationError as e:
            err = e.errors()[0]
            where = ".".join(map(str, err["loc"]))
            raise RunDirError(f"{path}: {where}: {err['msg'].removeprefix('Value error, ')}") from None

    def discard_if_unstarted(self) -> bool:
        """Remove the run dir if no turn was ever written (a run that failed while starting)."""
        if any(p.name not in ("config.json", "summary.json") for p in self.root.iterdir()):
            return False
        for p in self.root.iterdir():
            p.unlink()
        self.root.rmdir()
        return True

    def kernel_relpath(self, problem_stem: str, episode: int, turn: int) -> str:
        return f"kernels/{problem_stem}/{episode}-{turn}.py"

    def _append(self, name: str, record: BaseModel) -> None:
        path = self.root / name
        line = record.model_dump_json() + "\n"
        with self._lock:
            if not self._repaired:
                for name_ in ("turns.jsonl", "episodes.jsonl", "calls.jsonl"):
                    _repair_tail(self.root / name_)
                self._repaired = True
            with path.open("a", encoding="utf-8") as f:
                f.write(line)
                f.flush()
                os.fsync(f.fileno())

    def append_turn(self, record: TurnRecord) -> None:
        """Write the kernel file, then the turn line (a crash between leaves an orphan file only)."""
        if record.code is not None and record.kernel_path is not None:
            path = self.root / record.kernel_path
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(record.code)
        self._append("turns.jsonl", record)

    def append_episode(self, record: EpisodeRecord) -> None:
        self._append("episodes.jsonl", record)

    def append_call(self, record: CallRecord) -> None:
        self._append("calls.jsonl", record)

    def calls(self) -> list[CallRecord]:
        return list(read_jsonl(self.root / "calls.jsonl", CallRecord))

    def turns(self) -> list[TurnRecord]:
        return list(read_jsonl(self.root / "turns.jsonl", TurnRecord))

    def episodes(self) -> list[EpisodeRecord]:
        return list(read_jsonl(self.root / "episodes.jsonl", EpisodeRecord))

    def write_best(self, problem_stem: str, code: str) -> None:
        path = self.root / "best" / f"{problem_stem}.py"
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".py.tmp")
        tmp.write_text(code)
        tmp.replace(path)

    def summary(self) -> RunSummary:
        return RunSummary.model_validate_json((self.root / "summary.json").read_text())

    def write_summary(self, summary: RunSummary) -> None:
        tmp = self.root / "summary.json.tmp"
        tmp.write_text(summary.model_dump_json(indent=2) + "\n")
        tmp.replace(self.root / "summary.json")
