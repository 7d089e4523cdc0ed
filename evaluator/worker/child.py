"""Entry point of every child process: `python -m evaluator.worker.child MODE JOB.json RESULT_FD`.

MODE is `reference` (the trusted reference worker, see `evaluator.worker.reference_worker`), `candidate` (the
one process that imports and runs candidate code), `compile` (imports the candidate only to
build or check its kernels) or `forward` (a few forwards and nothing else, for `ncu`). Results
go to RESULT_FD as JSON lines (`evaluator.common.protocol`).

What the candidate process gets: the problem file, its own work dir with `candidate.py` and the
correctness inputs. Never the seeds, never the expected outputs, never the verdict.
"""

from __future__ import annotations

import importlib.util
import os
import resource
import sys
import traceback
from pathlib import Path
from types import ModuleType
from typing import Any

from pydantic import BaseModel

from kloop.evaluator.common.protocol import (
    CandidateJob,
    CompileJob,
    Control,
    ErrorMsg,
    ReadyMsg,
    ReferenceJob,
    StageMsg,
)
from kloop.evaluator.common.result import ErrorInfo

_TB_TAIL_FRAMES = 3
_MAX_TB_CHARS = 6000


class Channel:
    """The result pipe. Its fd is made non-inheritable so compilers started by the candidate do
    not keep it open."""

    def __init__(self, fd: int):
        if fd < 0:  # nobody listens (a forward replayed under a profiler)
            fd = os.open(os.devnull, os.O_WRONLY)
        os.set_inheritable(fd, False)
        self.fd = fd

    def send(self, msg: BaseModel) -> None:
        data = msg.model_dump_json().encode() + b"\n"
        while data:
            data = data[os.write(self.fd, data) :]

    def stage(self, stage: str) -> None:
        self.send(StageMsg(stage=stage))

    def error(self, stage: str, exc: BaseException, candidate_path: str | None,
              status: str | None = None) -> None:
        status = status or ("compile_error" if is_build_error(exc) else "runtime_error")
        self.send(ErrorMsg(stage=stage, status=status, error=error_info(exc, candidate_path)))


def error_info(exc: BaseException, candidate_path: str | None) -> ErrorInfo:
    """The exception as data; the traceback keeps the candidate's own frames and the last few."""
    frames = traceback.extract_tb(exc.__traceback__)
    keep = [
        f for i, f in enumerate(frames)
        if f.filename == candidate_path or i >= len(frames) - _TB_TAIL_FRAMES
    ]
    text = "".join(traceback.format_list(keep)) + "".join(
        traceback.format_exception_only(type(exc), exc)
    )
    message = str(exc)
    if isinstance(exc, SyntaxError):
        message = f"{exc.msg} (line {exc.lineno})"
    return ErrorInfo(type=type(exc).__name__, message=message[:4000], traceback=text[-_MAX_TB_CHARS:])


def is_build_error(exc: BaseException) -> bool:
    """Python syntax, missing imports, nvcc/ninja build failures and Triton compile errors."""
    if isinstance(exc, (SyntaxError, ImportError)):
        return True
    name, module = type(exc).__name__, type(exc).__module__
    if module.startswith("triton") and "Compilation" in name:
        return True
    if module.startswith("kloop.evaluator.compile"):
        return True
    return "Error building extension" in str(exc)


def import_candidate(path: str) -> ModuleType:
    """Import the candidate from its real file (Triton inspects kernel source through it)."""
    spec = importlib.util.spec_from_file_location("candidate", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["candidate"] = module
    spec.loader.exec_module(module)
    return module


def apply_overrides(module: ModuleType, overrides: dict[str, Any]) -> None:
    """Problem-size overrides also reach a candidate's copies of the same constants."""
    for key, value in overrides.items():
        if hasattr(module, key):
            setattr(module, key, value)


def limit_memory(limit_bytes: int | None) -> None:
    if limit_bytes is not None:
        resource.setrlimit(resource.RLIMIT_AS, (limit_bytes, limit_bytes))


def wait_for_device(channel: Channel, ahead: bool = False) -> bool:
    """Before the process's first use of the device: say it is ready and wait for `go` (the
    harness takes the device lock first, so a process start and its imports never hold it, and
    the CUDA context is made under it: one made beside a timing widens its tail).
    `ahead`: a candidate child that built its models before (`ReadyMsg.ahead`)."""
    channel.send(ReadyMsg(ahead=ahead))
    return read_control().next == "go"


def read_control() -> Control:
    line = sys.stdin.buffer.readline()
    return Control.model_validate_json(line) if line.strip() else Control(next="stop")


def call_server(fds: tuple[int, int, int] | None, layout_json: str | None, device: str):
    """The worker's end of the trusted clock's call channel, with the layout the harness sent."""
    from kloop.evaluator.common.wire import ServeLayout
    from kloop.evaluator.worker.serve import Server

    if fds is None or layout_json is None:
        raise RuntimeError("the harness opened no call channel for this worker")
    return Server(*fds, ServeLayout.model_validate_json(layout_json), device)


def main(argv: list[str]) -> int:
    mode, job_path, fd = argv[1], Path(argv[2]), int(argv[3])
    fds = tuple(int(x) for x in argv[4].split(",")) if len(argv) > 4 else None
    if mode in ("candidate", "compile", "forward"):
        from kloop.evaluator.worker.confine import confine_child

        confine_child()
    channel = Channel(fd)
    raw = job_path.read_text()
    if mode == "candidate":
        job = CandidateJob.model_validate_json(raw)
        limit_memory(job.memory_limit_bytes)
        from kloop.evaluator.worker.candidate import run_candidate

        run_candidate(job, channel, fds)  # type: ignore[arg-type]
    elif mode == "forward":
        from kloop.evaluator.worker.candidate import run_forward

        run_forward(CandidateJob.model_validate_json(raw), channel)
    elif mode == "reference":
        from kloop.evaluator.worker.reference_worker import run_reference

        run_reference(ReferenceJob.model_validate_json(raw), channel, fds)  # type: ignore[arg-type]
    elif mode == "compile":
        from kloop.evaluator.worker.candidate import run_compile

        run_compile(CompileJob.model_validate_json(raw), channel)
    else:
        raise SystemExit(f"unknown child mode {mode!r}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
