"""The evaluation worker of the ray executor: one actor per GPU (or per unit of the stand-in
resource), running kloop's own evaluator, exactly as `kloop run` does on one host. Imports no
Ray itself: `ray_pool` wraps the class with `ray.remote` when it starts the workers.

A problem arrives by content (its source, with its hash), not by path: the node may have no
copy of the driver's problem folder, or an older one. It is written once per hash into a folder
the evaluator's sandbox may read, and judged from there.
"""

from __future__ import annotations

import os
import socket
import tempfile
from pathlib import Path

from pydantic import BaseModel, ConfigDict

from kloop.evaluator.common.config import EvalConfig
from kloop.problems.registry import Problem


class WorkerInfo(BaseModel):
    model_config = ConfigDict(frozen=True)

    hostname: str
    pid: int
    hardware: str
    """The device this worker's evaluations run on: the GPU's name, or `cpu`."""
    visible_devices: str | None = None
    """`CUDA_VISIBLE_DEVICES` as the worker started with it: on a GPU node, the GPU Ray placed it
    on (its `num_gpus=1`); None where nothing set it."""


def device_name(device: str) -> str:
    """What `device` (an EvalConfig device) resolves to on this worker, by name."""
    import torch

    if device != "cpu" and torch.cuda.is_available():
        return torch.cuda.get_device_name(0)  # Ray shows each worker only its own GPU
    return "cpu"


class EvalWorker:
    def __init__(self, device: str) -> None:
        self.info = WorkerInfo(hostname=socket.gethostname(), pid=os.getpid(),
                               hardware=device_name(device),
                               visible_devices=os.environ.get("CUDA_VISIBLE_DEVICES"))
        # Readable by the evaluator's sandbox uid (it imports the problem file), writable by us.
        self.problems = Path(tempfile.gettempdir()) / f"kloop-problems-{os.getuid()}"
        self.problems.mkdir(mode=0o755, exist_ok=True)

    def hello(self) -> str:
        return self.info.model_dump_json()

    def local_problem(self, problem: Problem) -> Problem:
        """`problem` with its source in a file of this node, named as in the driver's folder."""
        folder = self.problems / problem.sha256[:24]
        path = folder / problem.path.name
        if not path.exists() or path.read_text() != problem.source:
            folder.mkdir(mode=0o755, exist_ok=True)
            tmp = folder / f".{path.name}.{os.getpid()}"
            tmp.write_text(problem.source)
            tmp.chmod(0o644)
            os.replace(tmp, path)  # a concurrent evaluation never reads a half-written file
        return problem.model_copy(update={"path": path})

    def evaluate(self, problem: Problem, source: str, config_json: str) -> str:
        """The EvalResult (as JSON) of kloop's evaluator; its exceptions propagate to the driver,
        which treats them as it does locally (an infrastructure fault of the evaluator)."""
        from kloop.evaluator import evaluate

        config = EvalConfig.model_validate_json(config_json)
        return evaluate(self.local_problem(problem), source, config).model_dump_json()
