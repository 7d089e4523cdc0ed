"""A candidate child built ahead (`CandidateJob.construct_ahead`, `EvalConfig.construct_at`):
what it does before the device lock, kept from the device and at SCHED_IDLE, and the check it
makes once the harness has given the device back (runs inside the candidate child).

Before the lock: import the candidate and build `ModelNew` (and the reparam trials' second
models) on CPU, as the reference worker builds its own (`reference_worker._prepare`). Any
failure there, or a process that cannot use the device once it is given back, means the
candidate is judged again the usual way in a new child: the harness decides, from what it
holds (the child's first message or its silence), and nothing here is judged.
"""

from __future__ import annotations

import contextlib
import os
import stat
from dataclasses import dataclass, field

import torch
from kloop.evaluator.common.protocol import CandidateJob, CompileMsg, FlagMsg
from kloop.evaluator.worker.child import apply_overrides
from kloop.evaluator.worker.construct import (
    apply_numerics,
    construct,
    init_inputs,
    load_problem,
    noisy_model,
    prepare_budget,
)
from kloop.evaluator.worker.probes import Baseline
from kloop.evaluator.worker.trials import Loaded
from pydantic import BaseModel

AHEAD_BYTES: int | None = None
"""At most this much of models (the main one and the reparam trials') is built before the lock;
second models that would not fit are built under it, as they always were. None:
`construct.prepare_budget()`, from the host's available memory."""
AHEAD_THREADS = 1
"""CPU threads for the build before the lock, as the reference worker's preparation
(`reference_worker.PREPARE_THREADS`): beside other evaluations' timings (the values built do
not depend on the thread count)."""


@dataclass
class Ahead:
    """What a candidate child made before the lock, on CPU, with the device hidden from it."""

    base: Baseline
    loaded: Loaded
    """`loaded.model` on CPU; None where the init inputs hold tensors (KernelBench places them
    on the device before it calls the constructor): built under the lock then."""
    models: dict[int, torch.nn.Module] = field(default_factory=dict)
    """Trial index -> its second model (reparam), on CPU."""
    pending: list[BaseModel] = field(default_factory=list)
    """Messages for the harness, sent once it has said go (it reads `ready` first)."""


def kept_from_device(hidden: list[str]) -> bool:
    """Whether this process was started as `construct_ahead` needs, checked in trusted code
    before any of the candidate's runs: every path in `hidden` is /dev/null (or absent) and
    the process is at SCHED_IDLE. If not (no template process to hide them, a host that
    refused), the child waits for the lock before the candidate's code runs, as without it."""
    try:
        null = os.stat(os.devnull).st_rdev
        for path in hidden:
            try:
                st = os.stat(path)
            except FileNotFoundError:
                continue
            if st.st_rdev != null or not stat.S_ISCHR(st.st_mode):
                return False
        return os.sched_getscheduler(0) == os.SCHED_IDLE
    except OSError:
        return False


def build_ahead(job: CandidateJob) -> Ahead | str:
    """Import the candidate and build its models on CPU, as the reference worker builds its own
    before the lock (`reference_worker._prepare`): the same construction, on CPU, then moved.
    A string when anything failed: why (the harness judges the candidate again the usual way,
    in a new child; this process may have met the hidden device, and keeps that)."""
    spec = job.problem
    pending: list[BaseModel] = []
    apply_numerics(spec.allow_tf32)
    if job.cpu_emulation:
        from kloop.evaluator.worker import emulation

        emulation.install()
        pending.append(FlagMsg(flag="cpu_emulation"))
    base = Baseline.take("cpu")  # the device part once the device is ours (`_place`)
    threads = torch.get_num_threads()
    torch.set_num_threads(AHEAD_THREADS)
    try:
        with CudaQueries.watched():
            return _build_ahead(job, base, pending)
    except BaseException as e:
        return f"{type(e).__name__}: {str(e)[:300]}"
    finally:
        torch.set_num_threads(threads)


def _build_ahead(job: CandidateJob, base: Baseline, pending: list[BaseModel]) -> Ahead | str:
    from kloop.evaluator.worker.candidate import _before_import, _import, builds_log

    spec = job.problem
    _before_import(job)
    module, names = _import(job)
    if (log_ := builds_log()) is not None:
        pending.append(CompileMsg(log=log_))
    if not isinstance(getattr(module, "ModelNew", None), type):
        return "the candidate defines no class ModelNew"
    apply_overrides(module, spec.overrides)
    cpu = spec.model_copy(update={"device": "cpu"})
    init = init_inputs(load_problem(spec), cpu)
    ahead = Ahead(base, Loaded(module, None, names), pending=pending)  # type: ignore[arg-type]
    if any(isinstance(x, torch.Tensor) for x in init):
        return ahead
    ahead.loaded.model = construct(module.ModelNew, init, cpu, fills_in=job.fills_path)
    budget = AHEAD_BYTES if AHEAD_BYTES is not None else prepare_budget()
    used = main = _bytes(ahead.loaded.model)
    for t in job.trials:
        if t.perturb_seed is not None and used + main <= budget:
            ahead.models[t.index] = noisy_model(module.ModelNew, init, cpu, t.perturb_seed,
                                                fills_in=t.fills_path)
            used += _bytes(ahead.models[t.index])
    return ahead


def _bytes(model: torch.nn.Module) -> int:
    return sum(t.numel() * t.element_size() for t in (*model.parameters(), *model.buffers()))


def device_unusable(device: str, hidden: list[str]) -> str | None:
    """Right after `go`, before anything of the candidate's runs again: whether this process
    can use the device it was kept from (a CUDA call made while it was hidden, by the
    candidate's import or constructor, leaves it unusable: torch keeps the device count it
    saw then). None when it can; else why, with what tells the causes apart (the retry's flag
    carries it): paths still covered, what the driver itself says now, and the first
    `torch.cuda` query made before the lock (`CudaQueries`)."""
    if not device.startswith("cuda"):
        return None
    try:
        torch.zeros(1, device=device)
        torch.cuda.synchronize(device)
    except Exception as e:
        covered = [p for p in hidden if _is_null(p)]
        return (f"{type(e).__name__}: {str(e)[:200]}; still covered: {covered or 'none'}; "
                f"driver now: {_driver_says()}; first torch.cuda query before the lock: "
                f"{CudaQueries.first or 'none'}")
    return None


def _is_null(path: str) -> bool:
    try:
        return os.stat(path).st_rdev == os.stat(os.devnull).st_rdev
    except OSError:
        return False


def _driver_says() -> str:
    import ctypes

    try:
        lib = ctypes.CDLL("libcuda.so.1")
        n = ctypes.c_int()
        return f"cuInit {lib.cuInit(0)}, cuDeviceGetCount {lib.cuDeviceGetCount(ctypes.byref(n))} " \
               f"({n.value} devices)"
    except OSError as e:
        return f"no driver library ({e})"


class CudaQueries:
    """Where the first `torch.cuda` device query before the lock came from (file:line of the
    caller), recorded while the build ahead runs: it is what a retry's flag names."""

    first: str | None = None
    NAMES = ("is_available", "device_count", "init", "current_device", "get_device_properties",
             "get_device_capability", "get_device_name")

    @classmethod
    @contextlib.contextmanager
    def watched(cls):
        import traceback

        saved = {n: getattr(torch.cuda, n) for n in cls.NAMES if hasattr(torch.cuda, n)}

        def wrap(name, fn):
            def watched_call(*args, **kwargs):
                if cls.first is None:
                    caller = traceback.extract_stack(limit=2)[0]
                    cls.first = f"torch.cuda.{name}() at {caller.filename}:{caller.lineno}"
                return fn(*args, **kwargs)
            return watched_call

        for name, fn in saved.items():
            setattr(torch.cuda, name, wrap(name, fn))
        try:
            yield
        finally:
            for name, fn in saved.items():
                if getattr(torch.cuda, name) is not fn:
                    setattr(torch.cuda, name, fn)
