"""The reference worker (runs in a child; trusted code only: the problem's reference).

Build the reference `Model` as the policy says, draw each probe trial's inputs from its salted
seed, compute the expected outputs (and, for the precision check, float64 ones) under
`no_grad`, write inputs (for the candidate) and expected outputs (harness-private) to disk; then
serve the harness's calls (`evaluator.worker.serve`) on the eager model and on torch.compile of
it (default mode, then mode="reduce-overhead"). The harness drives it from
`evaluator.harness.reference.collect_reference`.

What needs no device is made before the worker says it is ready, so before the harness takes
the device lock for it (`_prepare`): the problem, the models built on CPU, the trials' inputs.
"""

from __future__ import annotations

import copy
import types
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

import torch
from torch.overrides import TorchFunctionMode

from kloop.evaluator.common.protocol import (
    ROLES,
    DoneMsg,
    EnvMsg,
    ErrorMsg,
    FlagMsg,
    ReferenceJob,
    Sample,
    Served64,
    ServeMsg,
)
from kloop.evaluator.common.result import ErrorInfo
from kloop.evaluator.common.sample import Float64Outputs, reduce
from kloop.evaluator.common.wire import output_specs
from kloop.evaluator.worker.child import Channel, call_server, read_control, wait_for_device
from kloop.evaluator.worker.construct import (
    apply_numerics,
    as_output_list,
    clone_all,
    construct,
    draw_inputs,
    draw_served_inputs,
    env_info,
    init_inputs,
    load_problem,
    noisy_model,
    prepare_budget,
    sync,
    to_device,
)

PREPARED_BYTES: int | None = None
"""At most this much (the main model, inputs and second models, on CPU) is prepared before the
device lock and held until it is used; what would not fit is made under the lock, as it always
was. None: `construct.prepare_budget()`, from the host's available memory."""
PREPARE_THREADS = 1
"""CPU threads for that preparation: it runs beside other evaluations' timings, whose clocks
include their processes' host side, so it takes one core, not all of them (the values drawn do
not depend on the thread count)."""


@dataclass
class _Prepared:
    """What the worker made on CPU before it asked for the device."""

    problem: ModuleType
    init: list[Any]
    model: torch.nn.Module | None = None
    """The main model on CPU; None: built under the lock (its init inputs hold tensors, which
    KernelBench places on the device before it calls the constructor)."""
    inputs: dict[int, list[Any]] = field(default_factory=dict)
    """Trial index -> its inputs on CPU, already written for the candidate."""
    models: dict[int, torch.nn.Module] = field(default_factory=dict)
    """Trial index -> its second model (reparam) on CPU, its fills already written."""


def run_reference(job: ReferenceJob, ch: Channel,
                  call_fds: tuple[int, int, int] | None = None) -> None:
    spec = job.problem
    apply_numerics(spec.allow_tf32)
    try:
        # CPU work first, off the device lock (the harness takes it at `ready`): loading the
        # problem, building models on CPU the KernelBench way and drawing and writing the
        # trials' inputs are seconds at full sizes (L3/1's 671 M parameters, L3/13's 1 GiB
        # inputs per trial), during which other evaluations can use the GPU.
        prepared = _prepare(job)
    except BaseException as e:
        ch.error("reference", e, spec.path, "runtime_error")
        return
    if not wait_for_device(ch):
        return
    ch.stage("reference")
    try:
        ch.send(EnvMsg(env=env_info(spec.device)))
        problem, init = prepared.problem, prepared.init
        if prepared.model is None:
            init = init_inputs(problem, spec)
            model = construct(problem.Model, init, spec, fills_out=job.fills_path)
        else:
            model = prepared.model.to(device=spec.device)
        for t in job.trials:
            _trial(problem, model, init, spec, t, ch, prepared)
        specs: list | str = []
        if job.timing is not None:
            with torch.no_grad():
                probe = model(*draw_served_inputs(problem, 0, spec))
            specs = output_specs(as_output_list(probe))
            if isinstance(specs, str):
                raise TypeError(f"the reference's outputs cannot be served: {specs}")
    except BaseException as e:
        ch.error("reference", e, spec.path, "runtime_error")
        return
    if job.timing is not None:
        ch.stage("baselines")
        served = _serve_roles(job.roles(), model, problem, spec, specs, call_fds, ch)
        if served is None:
            return
        for s in job.served64:
            _served64(problem, model, spec, s, ch)
        if job.paired and served.server is not None:
            # Parked: the harness gives the device lock back and takes it again for the
            # candidate, whose timed calls it interleaves with these (same seeds, same hold).
            ch.stage("paired")
            _serve_paired(served, job, model, problem, spec, ch)
    ch.send(DoneMsg())


def _served64(problem, model, spec, s: Served64, ch: Channel) -> None:
    """Timed call `s.index`'s output in float64 and the fp32 reference's own relative error
    against it, computed from the inputs the call draws for its seed (drawn twice, so both
    forwards start from the random state the served call had)."""
    try:
        with torch.no_grad():
            out32 = as_output_list(model(*draw_served_inputs(problem, s.seed, spec)))
            m64 = float64_copy(model)
            x64 = [x.double() if isinstance(x, torch.Tensor) and x.is_floating_point() else x
                   for x in draw_served_inputs(problem, s.seed, spec)]
            with _Float64Draws():
                out64 = as_output_list(m64(*x64))
            sync(spec.device)
        del m64
        # Large outputs at the secret positions only, both precisions alike (on the device,
        # so the float64 output never crosses to the host whole).
        out64, kept = reduce(s.sample, out64)
        f64 = Float64Outputs(out64, kept["sampled"], kept["numels"], s.sample)
        out32 = [f64.pair(k, x) for k, x in enumerate(out32)]
        torch.save({"outputs": [_to_cpu_one(o) for o in out64], **kept,
                    "reference_rel_err": _worst_rel_err(out32, out64)}, s.path)
    except Exception as e:
        ch.send(FlagMsg(flag=f"precision_check_unavailable: {type(e).__name__}: {str(e)[:160]}"))


def _worst_rel_err(outs: list[Any], outs64: list[Any]) -> float | None:
    errs = []
    for x, r in zip(outs, outs64, strict=False):
        if isinstance(x, torch.Tensor) and isinstance(r, torch.Tensor) and \
                x.is_floating_point() and r.is_floating_point() and x.shape == r.shape:
            d = x.double() - r.double()
            norm = float(r.double().norm())
            if norm > 0 and bool(torch.isfinite(d).all()):
                errs.append(float(d.norm()) / norm)
    return max(errs) if errs else None


def _prepare(job: ReferenceJob) -> _Prepared:
    """Everything of the reference stage that needs no device, made on CPU exactly as the
    device path makes it (models are built on CPU and then moved either way; inputs are drawn
    on CPU), within `PREPARED_BYTES`. Inputs are kept in memory, not read back from the file
    written for the candidate, so nothing that can reach that file can change what the
    reference computes."""
    spec = job.problem
    cpu = spec.model_copy(update={"device": "cpu"})
    problem = load_problem(spec)
    init = init_inputs(problem, cpu)
    out = _Prepared(problem, init)
    if any(isinstance(x, torch.Tensor) for x in init):
        return out
    budget = PREPARED_BYTES if PREPARED_BYTES is not None else prepare_budget()
    threads = torch.get_num_threads()
    torch.set_num_threads(PREPARE_THREADS)
    try:
        out.model = construct(problem.Model, init, cpu, fills_out=job.fills_path)
        used = model_bytes = _bytes(out.model.parameters())
        for t in job.trials:
            inputs = draw_inputs(problem, t.input_seed, cpu)
            size = _bytes(inputs)
            second = None
            if t.perturb_seed is not None and used + size + model_bytes <= budget:
                second = noisy_model(problem.Model, init, cpu, t.perturb_seed,
                                     fills_out=t.fills_path)
                size += _bytes(second.parameters())
            if used + size > budget:
                break  # this trial and the rest are made under the lock
            torch.save(inputs, t.inputs_path)
            out.inputs[t.index] = inputs
            if second is not None:
                out.models[t.index] = second
            used += size
    finally:
        torch.set_num_threads(threads)
    return out


def _bytes(xs: Any) -> int:
    return sum(x.numel() * x.element_size() for x in xs if isinstance(x, torch.Tensor))


def _trial(problem, model, init, spec, t, ch: Channel, prepared: _Prepared) -> None:
    if t.index in prepared.inputs:
        inputs = to_device(prepared.inputs.pop(t.index), spec.device)
    else:
        inputs = draw_inputs(problem, t.input_seed, spec)
        torch.save(_to_cpu(inputs), t.inputs_path)
    if t.perturb_seed is None:
        trial_model = model
    elif t.index in prepared.models:
        trial_model = prepared.models.pop(t.index).to(device=spec.device)
    else:
        trial_model = noisy_model(problem.Model, init, spec, t.perturb_seed,
                                  fills_out=t.fills_path)
    torch.manual_seed(t.forward_seed)
    with torch.no_grad():
        out = trial_model(*clone_all(inputs))
    sync(spec.device)
    torch.save([_to_cpu_one(o) for o in as_output_list(out)], t.expected_path)
    if t.fp64_path is not None:
        _fp64(trial_model, inputs, t.forward_seed, t.fp64_path, t.fp64_sample, spec.device, ch)


def _fp64(model, inputs, forward_seed: int, path: str, sample: Sample | None, device: str,
          ch: Channel) -> None:
    """The same call in float64 (the precision check's yardstick); a model that cannot run in
    float64 leaves the check out, flagged."""
    try:
        m64 = float64_copy(model)
        x64 = [x.double() if isinstance(x, torch.Tensor) and x.is_floating_point() else x
               for x in clone_all(inputs)]
        torch.manual_seed(forward_seed)
        with torch.no_grad(), _Float64Draws():
            out = m64(*x64)
        sync(device)
        outs, kept = reduce(sample, as_output_list(out))
        torch.save({"outputs": [_to_cpu_one(o) for o in outs], **kept}, path)
        del m64
    except Exception as e:
        ch.send(FlagMsg(flag=f"precision_check_unavailable: {type(e).__name__}: {str(e)[:160]}"))


def float64_copy(model: torch.nn.Module) -> torch.nn.Module:
    """A float64 copy of `model` that runs: a deep copy, with functions kept in its modules
    (`self.f = lambda x: m.c_proj(...)`, L3/44) made to close over the copied modules instead
    of the float32 originals, and floating tensors kept as plain attributes (not buffers)
    converted too."""
    memo: dict[int, Any] = {}
    twin = copy.deepcopy(model, memo).double()
    for module in twin.modules():
        for name, value in list(vars(module).items()):
            if isinstance(value, types.FunctionType) and value.__closure__:
                cells = tuple(types.CellType(memo.get(id(c.cell_contents), c.cell_contents))
                              for c in value.__closure__)
                setattr(module, name, types.FunctionType(
                    value.__code__, value.__globals__, value.__name__, value.__defaults__, cells))
            elif isinstance(value, torch.Tensor) and value.is_floating_point():
                setattr(module, name, value.double())
    return twin


class _Float64Draws(TorchFunctionMode):
    """Tensors a float64 forward makes without naming a dtype (`torch.randn(...)` for an
    initial state, L3/35) are made as the float32 forward made them (the same random draws)
    and then widened, so both forwards start from the same values."""

    FACTORIES = {torch.randn, torch.rand, torch.zeros, torch.ones, torch.empty, torch.full,
                 torch.tensor, torch.arange, torch.linspace, torch.eye, torch.normal}

    def __torch_function__(self, func, types_, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if func in self.FACTORIES and (kwargs or {}).get("dtype") is None and \
                isinstance(out, torch.Tensor) and out.dtype == torch.float32:
            return out.double()
        return out


COMPILED_ROLES = {"compile": "default", "compile_ro": "reduce-overhead"}
"""The compiled baselines' roles and their torch.compile modes."""


@dataclass
class _Served:
    """What the roles' sessions left: the call server, and each role's callable that served
    without failing (a compiled baseline skipped for the cache is compiled when first asked)."""

    server: Any = None
    fns: dict[str, Any] = field(default_factory=dict)
    failed: set[str] = field(default_factory=set)


def _serve_roles(roles: list[str], model, problem, spec, specs, call_fds,
                 ch: Channel) -> _Served | None:
    """Serve the harness's calls, first on the eager model (their outputs are what every timed
    call of the candidate is checked against), then on torch.compile of it in each mode asked
    for. None when the eager model failed (the reference failed); a compiled baseline that
    fails is flagged and the next role is served all the same."""
    server = None
    done = _Served(fns={"eager": model})
    reset = False
    for role in roles:
        ch.send(ServeMsg(role=role, outputs=specs))
        control = read_control()
        if control.next != "serve":
            continue
        failed: list[str] = []
        raised: list[BaseException] = []

        def on_problem(message: str, exc: BaseException | None, role=role, failed=failed) -> None:
            failed.append(message)
            if role == "eager":
                if exc is not None:
                    ch.error("baselines", exc, spec.path, "runtime_error")
                else:
                    ch.send(ErrorMsg(stage="baselines", status="runtime_error", error=ErrorInfo(
                        type="ReferenceOutput", message=message)))
            else:
                first = (str(exc).strip().splitlines() or [""])[0] if exc else ""
                detail = f"{type(exc).__name__}: {first[:200]}" if exc else message
                ch.send(FlagMsg(flag=f"baseline_{role}_failed: {detail}"))

        def on_call_problem(message: str, exc: BaseException | None, raised=raised,
                            on_problem=on_problem) -> None:
            if exc is not None:
                raised.append(exc)
            on_problem(message, exc)

        try:
            server = done.server = server or call_server(call_fds, control.data, spec.device)
            fn = model
            if role in COMPILED_ROLES:
                if not reset:  # once: both compiled forms stay cached side by side after it
                    torch._dynamo.reset()
                    reset = True
                fn = done.fns[role] = torch.compile(model, mode=COMPILED_ROLES[role])
            skips = _cudagraph_skips() if role == "compile_ro" else 0  # eager: no dynamo import
            server.serve(fn, lambda seed: draw_served_inputs(problem, seed, spec), on_call_problem)
        except BaseException as e:
            on_problem(str(e), e)
        if failed:
            done.failed.add(role)
        if failed and role == "eager":
            return None
        if raised and server is not None:
            # The model's raise ended serving, but the harness's plan goes on to its stop (a
            # failed warm-up call is tried again as a timed one): answered here, so that the
            # next role starts on a clean channel.
            server.drain()
        elif role == "compile_ro" and not failed and (n := _cudagraph_skips() - skips):
            ch.send(FlagMsg(flag=f"baseline_compile_ro_no_cudagraphs: {n} graph(s) ran "
                                 f"without CUDA graphs (inductor skipped them)"))
    return done


def _serve_paired(served: _Served, job: ReferenceJob, model, problem, spec, ch: Channel) -> None:
    """Every role on demand, by the number a request names it (`protocol.ROLES`), until the
    harness says stop. A compiled role that failed in its own session is not offered; one whose
    timings came from the cache is compiled at its first call (the harness's warm-up calls).
    Kept between evaluations (`ReferenceJob.keep_serving`): one such session per `serve` the
    harness sends, each ended by its `stop`, with stage `paired` said again after each."""
    fns = {}
    for role in job.roles():
        if role in served.failed:
            continue
        fn = served.fns.get(role)
        if fn is None and role in COMPILED_ROLES:
            fn = torch.compile(model, mode=COMPILED_ROLES[role])
        if fn is not None:
            fns[ROLES[role]] = fn
    if not job.keep_serving:
        _session(served, fns, problem, spec, ch)
        return
    while fns and read_control().next == "serve":
        if not _session(served, fns, problem, spec, ch):
            return
        ch.stage("paired")  # parked again: the harness reads this evaluation's flags up to here


def _session(served: _Served, fns: dict, problem, spec, ch: Channel) -> bool:
    """One evaluation's paired calls, until its `stop`; a role that raises is dropped from
    `fns` (the harness stops asking for it, the rest go on). False: serving cannot go on."""

    def on_problem(message: str, exc: BaseException | None) -> None:
        detail = f"{type(exc).__name__}: {(str(exc).splitlines() or [''])[0][:200]}" if exc \
            else message
        ch.send(FlagMsg(flag=f"paired_baseline_failed: {detail}"))

    raised: list[int] = []

    def guarded(role: int, fn):
        def call(*args):
            try:
                return fn(*args)
            except BaseException:
                raised.append(role)
                raise
        return call

    while fns:
        raised.clear()
        try:
            served.server.serve({r: guarded(r, f) for r, f in fns.items()},
                                lambda seed: draw_served_inputs(problem, seed, spec), on_problem)
        except BaseException as e:
            on_problem(str(e), e)
            return False
        if not raised:
            return True
        fns.pop(raised[0], None)
    served.server.drain()
    return False


def _cudagraph_skips() -> int:
    """Graphs inductor compiled for reduce-overhead but ran without CUDA graphs (a CPU device,
    dynamic shapes, ops that cannot be captured): timed all the same, as torch.compile would
    run them, and flagged."""
    from torch._dynamo.utils import counters

    return counters["inductor"]["cudagraph_skips"]


def _to_cpu_one(x: Any) -> Any:
    return x.detach().cpu() if isinstance(x, torch.Tensor) else x


def _to_cpu(xs: list[Any]) -> list[Any]:
    return [_to_cpu_one(x) for x in xs]
