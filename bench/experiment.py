"""Throughput as a user sees it: a fixed batch drawn from every Level 3 problem, at KernelBench's
full sizes, on a fresh cache (first use included), through the scheduler as `kloop run` uses it.

    python bench/experiment.py [--device cuda] [--concurrency 8] [--problems all|L3/1,L3/4]
                               [--part K/N] [--kinds reference,cuda_lean,...] [--size full|small]
                               [--cache DIR] [--steady | --steady-only] [--no-warm-up]
                               [--kept-baselines N] [--reference-hold shared|exclusive]
                               [--baseline-start-hold exclusive|shared]
                               [--rows F] [--json F]
    python bench/experiment.py --list
    python bench/experiment.py --combine part1.json part2.json ... [--json F]
    python bench/experiment.py --old-root CHECKOUT [--old-kinds reference,triton] [--problems ...]

The batch is made here, never read from a model's replies, so it is the same on every machine.
For each problem, one candidate of each kind:

- `reference`: the problem's own code as a candidate (plain PyTorch);
- `cuda_lean`: the reference with its output passed through a CUDA copy kernel whose `.cu`
  names nothing of torch (the form the CUDA prompt asks for; built lean);
- `cuda_torch`: the same kernel in the usual KernelBench form, `torch/extension.h` in the `.cu`
  (built the plain way, with the precompiled header where it applies);
- `triton`: the same copy as a Triton kernel;
- `syntax`: a syntax error, and `wrong`: the output scaled by 1.5 (cheap failures).

The copy keeps every output exactly (float32 outputs go through the kernel, others are returned
as they are), so every candidate but the failures is correct.

Printed (and written with `--json`), each with its conditions:
- wall time and candidates per GPU-hour, first use included: a fresh cache (baselines, builds,
  inductor and Triton caches all cold) unless `--cache` names one that earlier parts warmed.
  First use starts with the warm-up `kloop run` does in its own process: every problem's kept
  baseline worker started, its baselines timed and compiled once (`evaluator.tools.warmup` with
  `keep`, the same code; before 2026-12-06 the warm-up timed them as `kloop baseline` does and
  each problem's first candidate then started its worker, compiling them again under the
  lock), on the clock and reported on its own as `warm_up_s`; `--no-warm-up` leaves the workers
  to each problem's first candidate instead;
- with `--steady`, the same batch again on the now-warm cache with every source changed by a
  comment (so each build is fresh and every problem's baselines are cached): the steady-state
  rate, labelled as such, and the projected wall time of 50 problems x 16 candidates:
  50 x (this batch's first-use cost per problem) + 800 / (steady rate);
- GPU busy as device time of real work over wall time: the sum over candidates of the timed
  calls' and the paired baselines' device time (the worker's CUDA events, bounded by the trusted
  clock; the trusted clock's net times where a side has no events). Correctness trials, builds
  and profiling are not counted: a lower bound;
- per-stage p50/p90 (`bench/throughput.py`'s table), the build p50 of each CUDA form and which
  path each CUDA build took (`lean`, `torch form`, `... refused`, `... failed`, plain).

A batch too long for one device call runs in parts: `--part K/N` takes every N-th problem from
the K-th, `--cache DIR` keeps the evaluator's cache in a directory the machine keeps between
calls (an ignored folder of the working tree), and `--rows F` appends every finished candidate;
each part prints its own figures, and the first part's first use is the one a user pays. The
`--json` file is rewritten after every finished candidate, marked `partial` until the run ends:
a part its call's limit cuts still brings back the figures of what it finished (never combined).
Parts may also run on machines of their own, in different sessions (a device call's machine is
bare): `--combine` adds up their `--json` files into one figure (candidates, wall and busy
seconds summed, so every part's first use is charged; build p50 over all parts' builds). Each part
records a digest of the judging code (`evaluator/`, `problems/`, `kloop/`), one of what makes and
drives the batch (the templates here, `bench/throughput.py`) and its settings; `--combine`
refuses parts that differ in any, so a figure spread over sessions is one evaluator's on one
batch.
On a multi-GPU machine `scripts/parts_on_gpus.sh` (step `experiment-gpus`) runs several parts at
once, one per GPU, each with a fresh cache of its own; each records `host_parts`, how many ran
beside it on the host. A part too long for one call runs in two calls of one machine: its first pass (no `--steady`) on
the fresh machine, then `--steady-only` on the cache it left, which first makes again, off the
clock, what the first pass left in its process (`primer_of`: one reference candidate per
problem, for the kept baseline workers and the timing budget's estimates, and the first
problem's candidates of each kind that builds, so that on an empty cache the machine's first
builds are not in the steady pass); `--combine` joins the two files of the same problems into
one part.

`--old-root CHECKOUT` measures the old path instead, as a ratio: the batch's `--old-kinds`
candidates (default: the reference and the Triton copy of each problem) judged through another
checkout's evaluator (the old path of record is 69bdd97, `git worktree add .old-path 69bdd97`;
a checkout from before one import name runs through its own `evaluator` package) and then
through this one, each in a fresh process on a fresh cache with its first use on the clock
(this checkout's warm-up included), one after the other in one call.
The old path as a ratio: `bench/throughput.py --kloop-root` runs a batch through another checkout.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
HERE = Path(__file__).resolve().parent
# This directory holds bench/evaluator.py, which would shadow the `evaluator` package.
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != HERE]
sys.path[:0] = [str(REPO)]

# What judges a candidate: parts run at different commits may be added up only where this code
# is the same (bench and docs may change between the calls of a figure spread over sessions).
JUDGING_CODE = ("evaluator", "problems", "kloop")


def primer_of(items: list[dict]) -> list[dict]:
    """What `--steady-only` runs off the clock first: one reference candidate per problem (its
    kept baseline worker and the timing budget's estimates, as a first pass leaves them), and the
    first problem's candidates of every kind that builds (the machine's first CUDA builds of each
    form and its first Triton compile: the precompiled headers and the compilers' own first use,
    which a first pass would have paid, never the steady pass)."""
    first = items[0]["problem"] if items else None
    builds = {"cuda_lean", "cuda_torch", "triton"}
    return [it for it in items if it["kind"] == "reference"
            or (it["problem"] == first and it["kind"] in builds)]


def judging_digest(root: Path = REPO) -> str:
    """A digest of the judging code's files (names and bytes), caches left out."""
    import hashlib

    h = hashlib.sha256()
    for top in JUDGING_CODE:
        for f in sorted((root / top).rglob("*")):
            if f.is_file() and "__pycache__" not in f.parts and f.suffix != ".pyc":
                h.update(str(f.relative_to(root)).encode() + b"\0" + f.read_bytes() + b"\0")
    return h.hexdigest()[:16]


KINDS = ("reference", "cuda_lean", "cuda_torch", "triton", "syntax", "wrong")
PROJECTED_PROBLEMS, PROJECTED_PER_PROBLEM = 50, 16

# The copy kernels, applied to every float32 CUDA tensor the reference returns.
_WRAP = '''

class ModelNew(_Reference):
    def forward(self, *args):
        out = super().forward(*args)
        if isinstance(out, tuple):
            return tuple(_copy(o) for o in out)
        return _copy(out)
'''
_TRITON = '''
import torch
import triton
import triton.language as tl


@triton.jit
def _copy_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(y_ptr + offs, tl.load(x_ptr + offs, mask=mask), mask=mask)


def _copy(t):
    if not isinstance(t, torch.Tensor) or t.dtype != torch.float32:
        return t
    x = t.contiguous()
    y = torch.empty_like(x)
    n = x.numel()
    _copy_kernel[(triton.cdiv(n, 1024),)](x, y, n, BLOCK=1024)
    return y
'''
_CUDA_KERNEL = r'''
__global__ void kloop_copy_kernel(const float* __restrict__ x, float* __restrict__ y, long n) {
    long i = (long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = x[i];
}
'''
_CUDA_LEAN = '''
import torch
from torch.utils.cpp_extension import load_inline

_cuda = r"""%(kernel)s
void kloop_copy_launch(const float* x, float* y, long n, cudaStream_t stream) {
    int threads = 256;
    kloop_copy_kernel<<<(unsigned)((n + threads - 1) / threads), threads, 0, stream>>>(x, y, n);
}
"""
_cpp = r"""
#include <c10/cuda/CUDAStream.h>

void kloop_copy_launch(const float* x, float* y, long n, cudaStream_t stream);

torch::Tensor copy_forward(torch::Tensor x) {
    auto xc = x.contiguous();
    auto y = torch::empty_like(xc);
    kloop_copy_launch(xc.data_ptr<float>(), y.data_ptr<float>(), xc.numel(),
                      c10::cuda::getCurrentCUDAStream().stream());
    return y;
}
"""
_ext = load_inline(name="kloop_bench_copy_lean_%(tag)s", cpp_sources=_cpp, cuda_sources=_cuda,
                   functions=["copy_forward"], verbose=False)


def _copy(t):
    if not isinstance(t, torch.Tensor) or t.dtype != torch.float32:
        return t
    return _ext.copy_forward(t)
'''
_CUDA_TORCH = '''
import torch
from torch.utils.cpp_extension import load_inline

_cuda = r"""
#include <torch/extension.h>
#include <c10/cuda/CUDAStream.h>
%(kernel)s
torch::Tensor copy_forward(torch::Tensor x) {
    auto xc = x.contiguous();
    auto y = torch::empty_like(xc);
    long n = xc.numel();
    int threads = 256;
    kloop_copy_kernel<<<(unsigned)((n + threads - 1) / threads), threads, 0,
                        c10::cuda::getCurrentCUDAStream().stream()>>>(
        xc.data_ptr<float>(), y.data_ptr<float>(), n);
    return y;
}
"""
_cpp = "torch::Tensor copy_forward(torch::Tensor x);"
_ext = load_inline(name="kloop_bench_copy_torch_%(tag)s", cpp_sources=_cpp, cuda_sources=_cuda,
                   functions=["copy_forward"], verbose=False)


def _copy(t):
    if not isinstance(t, torch.Tensor) or t.dtype != torch.float32:
        return t
    return _ext.copy_forward(t)
'''


def candidate(problem_source: str, kind: str, tag: str) -> str:
    """One candidate of `kind` for a problem (`tag`: makes each extension's name its own)."""
    from kloop.problems.registry import reference_as_candidate

    ref = reference_as_candidate(problem_source)
    if kind == "reference":
        return ref
    if kind == "syntax":
        return ref + "\n\ndef broken(:\n    pass\n"
    inner = ref.replace("class ModelNew(", "class _Reference(", 1).replace(
        "super(ModelNew, self)", "super(_Reference, self)")
    if kind == "wrong":
        return inner + _WRAP.replace("return _copy(out)", "return out * 1.5").replace(
            "tuple(_copy(o) for o in out)", "tuple(o * 1.5 for o in out)")
    head = {"triton": _TRITON,
            "cuda_lean": _CUDA_LEAN % {"kernel": _CUDA_KERNEL, "tag": tag},
            "cuda_torch": _CUDA_TORCH % {"kernel": _CUDA_KERNEL, "tag": tag}}[kind]
    return head + "\n\n" + inner + _WRAP


def batch(problems: list[str], kinds: list[str], size: str) -> list[dict]:
    """[{label, problem, kind, source, overrides}], problem by problem."""
    from kloop.evaluator.tools.cli import problem_overrides
    from kloop.problems.registry import get_problem

    out = []
    for pid in problems:
        prob = get_problem(pid)
        overrides = problem_overrides(prob, size, [])
        tag = prob.stem.split("_")[0]
        for kind in kinds:
            out.append({"label": f"{pid} {kind}", "problem": pid, "kind": kind,
                        "source": candidate(prob.source, kind, tag), "overrides": overrides})
    return out


def batch_digest() -> str:
    """A digest of what makes and runs the batch: the candidates' templates and generators here
    and `bench/throughput.py` (the scheduler's driver). Parts made by different batches or
    drivers are not one figure, whatever the evaluator."""
    import hashlib
    import inspect

    made = "\0".join([repr(KINDS), _WRAP, _TRITON, _CUDA_KERNEL, _CUDA_LEAN, _CUDA_TORCH,
                      inspect.getsource(candidate), inspect.getsource(batch)])
    driver = (HERE / "throughput.py").read_bytes()
    return hashlib.sha256(made.encode() + b"\0" + driver).hexdigest()[:16]


def device_ms(result) -> float:
    """Device time of the real work one evaluation measured: its timed calls and the baselines
    timed beside them, each call's CUDA-event time bounded by the trusted clock where the side
    has it, else the trusted clock's net time (ms, summed over calls)."""
    total = 0.0
    for stats in (result.timing, result.eager, result.compiled, result.compiled_ro):
        if stats is None or not stats.n_trials:
            continue
        per_call = stats.events.mean_ms if stats.events is not None else stats.mean_ms
        total += per_call * stats.n_trials
    return total


def _stop_policy(width: float | None) -> str | None:
    """The strict policy with the sequential rule at `width`, registered in this process (the
    judging one) as `strict_stop`; None: the default policy."""
    if width is None:
        return None
    from kloop.evaluator.common.config import POLICIES

    POLICIES["strict_stop"] = POLICIES["strict"].model_copy(
        update={"name": "strict_stop", "timing_stop_width": width})
    return "strict_stop"


def row_of(result) -> dict:
    c, e = result.compile, result.error
    plan = result.paired.plan if result.paired is not None else None
    return {"device_ms": device_ms(result), "backend": result.backend,
            "build_s": c.seconds if c is not None else None,
            "nvcc_runs": list(c.nvcc_runs) if c is not None else [],
            # Timed calls a side and where their count came from (`harness.budget`).
            "timed_calls": plan.calls if plan is not None else None,
            "plan_source": plan.source if plan is not None else None,
            # Calls a side the rounds made: the plan's, or about half where the sequential rule
            # stopped them (`Policy.timing_stop_width`).
            "calls_made": result.timing.n_trials if result.timing is not None else None,
            "stopped_early": result.paired.stopped_early if result.paired is not None else None,
            "width_at_check": result.paired.width_at_check if result.paired is not None else None,
            # Each speedup with its interval: the reference's and the copy kernels' read 1.00.
            "speedups": {name: [getattr(result, f"speedup_vs_{name}"), ci.low, ci.high]
                         for name, ci in result.speedup_ci.items()},
            # A failure's first line: a candidate that fails for a reason the batch did not
            # build into it (out of GPU memory beside the others) must be told apart.
            "error": f"{e.type}: {(e.message.splitlines() or [''])[0][:200]}" if e else None}


def build_path(row: dict) -> str:
    """How a CUDA build went: `lean` or `torch form` (split into halves), `lean refused`,
    `lean failed`, `torch form refused` or `torch form failed` (then plain), or `plain`."""
    for run in row.get("nvcc_runs", []):
        if run.startswith(("lean", "torch form")):
            return run.split(":")[0].split(" (")[0]
    return "plain"


def summarise(res: dict, items: list[dict], problems: int) -> dict:
    from throughput import lock_held  # `main` put this folder on the path

    rows = res["rows"]
    kind_of = {it["label"]: it["kind"] for it in items}
    # Rows made without `row_of` (the old path's inner runs) carry no device time: not measured,
    # never 0 %.
    busy_ms = sum(r["device_ms"] for r in rows) if all("device_ms" in r for r in rows) else None
    builds: dict[str, list[float]] = {}
    paths: dict[str, dict[str, int]] = {}
    for r in rows:
        kind = kind_of.get(r["label"], "")
        if kind.startswith("cuda") and r.get("build_s") is not None:
            builds.setdefault(kind, []).append(r["build_s"])
            p = paths.setdefault(kind, {})
            p[build_path(r)] = p.get(build_path(r), 0) + 1
    statuses: dict[str, int] = {}
    for r in rows:
        statuses[r["status"]] = statuses.get(r["status"], 0) + 1
    warm = res.get("warm_s")  # the warm-up is first use: on the clock
    # The device lock is the queue at full sizes: what the candidates held it for, beside the
    # device time of their timed calls (`busy_s`), says how much of a hold is the harness's.
    held = sum(lock_held(r) for r in rows)
    return _figures(len(rows), problems, res["wall_s"] + (warm or 0.0),
                    None if busy_ms is None else busy_ms / 1000.0, builds,
                    paths, statuses, warm, held)


def _figures(candidates: int, problems: int, wall_s: float, busy_s: float | None,
             builds: dict[str, list[float]], paths: dict[str, dict[str, int]],
             statuses: dict[str, int], warm_up_s: float | None = None,
             held_s: float | None = None) -> dict:
    """One pass's figures; the raw build times and busy seconds stay in, so that passes run as
    parts on several machines can be added up (`combine`). `wall_s` includes `warm_up_s`;
    `held_s`: the device lock's holds by the candidates' evaluations, summed."""
    return {"candidates": candidates, "problems": problems, "wall_s": wall_s,
            "warm_up_s": warm_up_s, "held_s": held_s,
            "per_gpu_hour": candidates / wall_s * 3600 if wall_s else None,
            "busy_s": busy_s,
            "gpu_busy_real_work": busy_s / wall_s if wall_s and busy_s is not None else None,
            "build_s": builds,
            "build_p50_s": {k: statistics.median(v) for k, v in builds.items()},
            "build_paths": paths, "statuses": statuses}


def _add(counts: list[dict[str, int]]) -> dict[str, int]:
    out: dict[str, int] = {}
    for c in counts:
        for k, v in c.items():
            out[k] = out.get(k, 0) + v
    return out


def combine(parts: list[dict]) -> dict:
    """The figure of record from parts (`--json` files of `--part K/N` runs), each on a machine
    of its own: candidates, problems, wall and busy seconds are added, so the rate is what one
    machine running the parts one after another would give, every part's first use included
    (a single run pays a machine's own start-up once: the sum overstates it, never hides it).
    Parts must share device, GPU, size, concurrency, the evaluator's settings and the judging
    code (`judging_digest`: parts of one figure may come from different sessions, but never from
    different evaluators), and no problem may be in two of them."""
    if not parts:
        raise ValueError("no parts to combine")
    parts = [_finished_passes(p) for p in parts]
    if cut := [p["conditions"].get("part") for p in parts if p.get("partial")]:
        raise ValueError(f"parts cut before they finished (partial): {cut}; run them again")
    keys = ("device", "gpu", "size", "concurrency", "warm_up", "judging_code", "batch_code",
            "kept_baselines", "reference_hold", "baseline_start_hold", "stop_width",
            "candidate_hold")
    if any(k not in p["conditions"] for p in parts for k in ("judging_code", "batch_code")):
        raise ValueError("a part without its judging code's or batch's digest: rerun it with "
                         "this bench")
    first_c = parts[0]["conditions"]
    for p in parts[1:]:
        if differ := [k for k in keys if p["conditions"].get(k) != first_c.get(k)]:
            raise ValueError("parts differ in " + ", ".join(
                f"{k} ({first_c.get(k)} vs {p['conditions'].get(k)})" for k in differ))
    if any("problem_ids" not in p["conditions"] for p in parts):
        raise ValueError("a part without its problem ids: rerun it with this bench")
    parts = _halves_joined(parts)
    labels = [p["conditions"].get("part") or "all" for p in parts]
    ids = [i for p in parts for i in p["conditions"]["problem_ids"]]
    if twice := sorted({i for i in ids if ids.count(i) > 1}):
        raise ValueError(f"problems counted by more than one part: {', '.join(twice)}")
    passes: dict[str, dict | None] = {}
    for name in ("first_use_included", "steady_state"):
        got = [p[name] for p in parts if p.get(name) is not None]
        if len(got) != len(parts):
            passes[name] = None
            continue
        builds: dict[str, list[float]] = {}
        for g in got:
            if "build_s" not in g:
                raise ValueError("a part without raw build times: rerun it with this bench")
            for k, v in g["build_s"].items():
                builds.setdefault(k, []).extend(v)
        paths: dict[str, dict[str, int]] = {}
        for k in {k for g in got for k in g["build_paths"]}:
            paths[k] = _add([g["build_paths"].get(k, {}) for g in got])
        warm = [g.get("warm_up_s") for g in got]
        held = [g.get("held_s") for g in got]
        passes[name] = _figures(sum(g["candidates"] for g in got),
                                sum(g["problems"] for g in got), sum(g["wall_s"] for g in got),
                                None if any(g["busy_s"] is None for g in got)
                                else sum(g["busy_s"] for g in got), builds, paths,
                                _add([g["statuses"] for g in got]),
                                None if None in warm else sum(warm),
                                None if None in held else sum(held))
    first, steady = passes["first_use_included"], passes["steady_state"]
    # Parts run alone on a machine and parts run beside others on one host (one GPU each)
    # add up alike; each part's company is kept with the figure.
    return {"conditions": {**{k: first_c.get(k) for k in keys}, "parts": labels,
                           "host_parts": [p["conditions"].get("host_parts", 1) for p in parts],
                           "hosts": [(p["conditions"].get("host") or {}).get("state", "unrecorded")
                                     for p in parts],
                           "problem_ids": ids,
                           "started": [p["conditions"].get("started") for p in parts]},
            "first_use_included": first, "steady_state": steady,
            "projection": project(first, steady) if first is not None else None}


def _finished_passes(part: dict) -> dict:
    """A part whose call's limit cut its steady pass still finished its first pass: that pass
    counts (as a first pass alone, to be joined with a `--steady-only` file of the same
    problems); a cut pass never does."""
    cut = part.get("partial")
    if cut and cut.get("pass") == "steady_state" and part.get("first_use_included"):
        return {**part, "steady_state": None, "partial": None,
                "conditions": {**part["conditions"], "steady_cut": cut}}
    return part


def _halves_joined(parts: list[dict]) -> list[dict]:
    """A part run in two calls of one machine (its first pass, then `--steady-only`) is one
    part: the two files of the same problems, one with only the first pass and one with only
    the steady pass, become one."""
    firsts = {tuple(p["conditions"]["problem_ids"]): p for p in parts
              if p.get("steady_state") is None and p.get("first_use_included") is not None}
    out, joined = [], set()
    for p in parts:
        key = tuple(p["conditions"]["problem_ids"])
        if p.get("first_use_included") is None and p.get("steady_state") is not None:
            if key not in firsts:
                raise ValueError(f"a steady pass without its first pass: {list(key)}")
            first = firsts[key]
            joined.add(id(first))
            out.append({**first, "steady_state": p["steady_state"],
                        "conditions": {**first["conditions"],
                                       "part": f"{first['conditions'].get('part') or 'all'}"
                                               "+steady"}})
        else:
            out.append(p)
    return [p for p in out if id(p) not in joined]


def project(first: dict, steady: dict | None) -> dict | None:
    """The wall time of 50 problems x 16 candidates: the first pass's fixed cost per problem
    (its wall beyond what its candidates cost at the steady rate) for every problem, plus every
    candidate at the steady rate. None without a steady pass."""
    if steady is None or not steady["per_gpu_hour"] or not first["problems"]:
        return None
    per_candidate_s = 3600.0 / steady["per_gpu_hour"]
    fixed = max(0.0, first["wall_s"] - first["candidates"] * per_candidate_s) / first["problems"]
    n = PROJECTED_PROBLEMS * PROJECTED_PER_PROBLEM
    return {"first_use_per_problem_s": fixed, "steady_per_candidate_s": per_candidate_s,
            "projected_wall_s": PROJECTED_PROBLEMS * fixed + n * per_candidate_s,
            "projected": f"{PROJECTED_PROBLEMS} problems x {PROJECTED_PER_PROBLEM} candidates"}


def _print(name: str, s: dict) -> None:
    busy = s["gpu_busy_real_work"]
    print(f"== {name}: {s['candidates']} candidates on {s['problems']} problems in "
          f"{s['wall_s']:.1f} s = {s['per_gpu_hour']:.0f} per GPU-hour; GPU busy with real work "
          f"{'-' if busy is None else f'{busy:.0%}'} (device time of timed and baseline calls "
          "over wall) ==")
    if s.get("held_s") is not None:
        busy_s = "-" if s["busy_s"] is None else f"{s['busy_s']:.1f}"
        print(f"  device lock held {s['held_s']:.1f} s in all, {busy_s} s of it the "
              f"timed and baseline calls' device time")
    if s.get("warm_up_s") is not None:
        print(f"  of which the warm-up (every problem's kept baseline worker started, as "
              f"`kloop run` starts them): {s['warm_up_s']:.1f} s")
    for kind, p50 in s["build_p50_s"].items():
        print(f"  build p50 {kind}: {p50:.1f} s; paths {s['build_paths'].get(kind)}")
    print(f"  statuses: {s['statuses']}")


HOST_MARK = Path("/tmp/kloop-experiment-host.jsonl")
"""Every experiment run on this machine appends a line here. A device machine starts bare, so a
run that finds the file is not on a fresh machine: an earlier call warmed the host's page cache,
its driver and its compilers' files, which a fresh cache directory does not undo."""


def host_of(mark: Path = HOST_MARK) -> dict:
    """`fresh`, or `warm` with the runs before this one on the machine (their parts and starts);
    this run is added to the file."""
    earlier = []
    if mark.exists():
        for line in mark.read_text().splitlines():
            try:
                earlier.append(json.loads(line))
            except ValueError:
                continue
    here = {"pid": os.getpid(),
            "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    try:
        with mark.open("a") as f:
            f.write(json.dumps(here) + "\n")
    except OSError:
        pass
    return {"state": "warm" if earlier else "fresh", "earlier_runs": len(earlier)}


def gpu_name(device: str) -> str | None:
    """The GPU's model (parts on an H100 and an H200 must not be added up), None on CPU."""
    if not device.startswith("cuda"):
        return None
    import torch

    return torch.cuda.get_device_name(torch.device(device))


def problems_of(arg: str, part: str | None) -> list[str]:
    from kloop.problems.registry import load_problem_set

    ids = [p.id for p in load_problem_set(None).filter(3)] if arg == "all" else arg.split(",")
    if part:
        k, n = (int(x) for x in part.split("/"))
        if not 1 <= k <= n:
            raise SystemExit(f"--part {part}: K/N with 1 <= K <= N")
        ids = ids[k - 1::n]
    return ids


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--ahead", type=int)
    ap.add_argument("--host-parts", type=int, default=1, metavar="N",
                    help="how many parts run at once on this host, one per GPU "
                         "(scripts/parts_on_gpus.sh); recorded with the figures")
    ap.add_argument("--problems", default="all", help="all, or ids: L3/1,L3/4")
    ap.add_argument("--part", help="K/N: every N-th problem from the K-th (one device call each)")
    ap.add_argument("--kinds", default=",".join(KINDS))
    ap.add_argument("--size", choices=("full", "small"), default="full")
    ap.add_argument("--cache", type=Path, help="the evaluator's cache (default: a fresh one)")
    ap.add_argument("--steady", action="store_true", help="then the batch again, warm")
    ap.add_argument("--steady-only", action="store_true",
                    help="only the steady pass, on the --cache a first pass left on this machine "
                         "(a part too long for one call: its first pass, then this in the next "
                         "call of the same warm machine); first primed off the clock")
    ap.add_argument("--no-warm-up", action="store_true",
                    help="no baseline warm-up first: each problem's first candidate times them")
    ap.add_argument("--kept-baselines", type=int, metavar="N",
                    help="EvalConfig.kept_baselines (default: the config's, 4 on a GPU; 0: each "
                         "evaluation's own reference worker serves its paired baselines)")
    ap.add_argument("--reference-hold", choices=("shared", "exclusive"),
                    help="EvalConfig.reference_hold (default: the config's, shared)")
    ap.add_argument("--baseline-start-hold", choices=("exclusive", "shared"),
                    help="EvalConfig.baseline_start_hold (default: the config's, shared)")
    ap.add_argument("--candidate-hold", choices=("untimed_shared", "exclusive"),
                    help="EvalConfig.candidate_hold (default: the config's, exclusive)")
    ap.add_argument("--compare-candidate-hold", choices=("untimed_shared", "exclusive"),
                    metavar="MODE", help="after the steady pass, the same batch again (fresh "
                    "builds) with EvalConfig.candidate_hold at MODE, in the same process")
    ap.add_argument("--stop-width", type=float, metavar="W",
                    help="the rounds' sequential rule (Policy.timing_stop_width) at W: the strict "
                         "policy with it, registered as strict_stop (default: off)")
    ap.add_argument("--compare-stop-width", type=float, metavar="W",
                    help="after the steady pass, the same batch again (fresh builds) with the "
                         "sequential rule at W, in the same process: the two steady rates side "
                         "by side")
    ap.add_argument("--old-root", type=Path, metavar="CHECKOUT",
                    help="only the old path's ratio: a subset through CHECKOUT's evaluator, then "
                         "through this one, each first use included")
    ap.add_argument("--old-kinds", default="reference,triton",
                    help="with --old-root: the kinds of the subset")
    ap.add_argument("--rows", type=Path, help="append each finished candidate's row here")
    ap.add_argument("--json", type=Path)
    ap.add_argument("--trace", type=Path, help="append each candidate child's messages (arrival "
                    "and judging times, the harness's debug log) to this file")
    ap.add_argument("--profile-trials", action="store_true",
                    help="each candidate child's probe trials under cProfile; the profiles come "
                         "back as flags in the rows (diagnostics: never a figure of record)")
    ap.add_argument("--list", action="store_true")
    ap.add_argument("--combine", type=Path, nargs="+", metavar="PART_JSON",
                    help="add up the --json files of parts run on machines of their own")
    args = ap.parse_args(argv)
    if args.combine:
        return _combined(args.combine, args.json)
    if args.trace:
        _trace_to(args.trace)
    if args.profile_trials:
        _profile_judging()
    sys.path[:0] = [str(HERE)]
    from throughput import report, run_batch

    kinds = args.kinds.split(",")
    if unknown := sorted(set(kinds) - set(KINDS)):
        raise SystemExit(f"--kinds: unknown {unknown}; known: {', '.join(KINDS)}")
    if (args.steady or args.steady_only) and args.cache is None:
        raise SystemExit("--steady needs --cache (the second pass runs on the first's cache)")
    if args.steady_only and args.steady:
        raise SystemExit("--steady-only replaces --steady (it runs the steady pass alone)")
    problems = problems_of(args.problems, args.part)
    if args.old_root is not None:
        return old_path(args, problems)
    items = batch(problems, kinds, args.size)
    if args.list:
        for it in items:
            print(it["label"])
        return 0
    conditions = {"device": args.device, "concurrency": args.concurrency, "size": args.size,
                  "cache": "given" if args.cache else "fresh", "part": args.part,
                  "warm_up": not args.no_warm_up, "gpu": gpu_name(args.device),
                  "host_parts": args.host_parts, "host": host_of(),
                  "kept_baselines": args.kept_baselines, "reference_hold": args.reference_hold,
                  "baseline_start_hold": args.baseline_start_hold, "stop_width": args.stop_width,
                  "candidate_hold": args.candidate_hold, "judging_code": judging_digest(),
                  "batch_code": batch_digest(),
                  "problem_ids": problems, "passes": "steady" if args.steady_only else
                  "first+steady" if args.steady else "first",
                  "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    settings = {k: v for k, v in (("kept_baselines", args.kept_baselines),
                                  ("reference_hold", args.reference_hold),
                                  ("baseline_start_hold", args.baseline_start_hold),
                                  ("candidate_hold", args.candidate_hold),
                                  ("profile_trials", args.profile_trials or None),
                                  ("policy", _stop_policy(args.stop_width)))
                if v is not None} or None
    partial = _partial_writer(args.json, conditions, items, len(problems))
    first = None
    if args.steady_only:
        # Off the clock: what the first pass left in this process (kept baseline workers, the
        # timing budget's estimates) is made again by one reference candidate per problem,
        # on the first pass's cache; the steady pass then starts where it would have.
        primer = [{**it, "source": it["source"] + f"\n# primer {time.time_ns()}\n"}
                  for it in primer_of(items)]
        conditions["primer"] = [it["label"] for it in primer]
        t0 = time.monotonic()
        run_batch(primer, args.device, args.concurrency, None, settings, ahead=args.ahead,
                  cache_dir=args.cache, row_of=row_of, warm=not args.no_warm_up)
        conditions["primed_s"] = round(time.monotonic() - t0, 1)
        print(f"primed off the clock in {conditions['primed_s']} s")
    else:
        first_res = run_batch(items, args.device, args.concurrency, args.rows, settings,
                              ahead=args.ahead, cache_dir=args.cache, row_of=row_of,
                              warm=not args.no_warm_up, on_row=partial("first_use_included"))
        report("first use included (the batch after its warm-up)", first_res, len(items))
        first = summarise(first_res, items, len(problems))
        _print("first use included", first)
    steady = None
    if args.steady or args.steady_only:
        # Every source changed by a comment: builds are fresh, baselines and caches are warm.
        again = [{**it, "source": it["source"] + f"\n# steady pass {time.time_ns()}\n"}
                 for it in items]
        steady_res = run_batch(again, args.device, args.concurrency, args.rows, settings,
                               ahead=args.ahead, cache_dir=args.cache, row_of=row_of,
                               on_row=partial("steady_state", first))
        report("steady state (baselines and caches warm, builds fresh)", steady_res, len(again))
        steady = summarise(steady_res, again, len(problems))
        _print("steady state (baselines and caches warm, builds fresh)", steady)
    stop = hold = None
    if args.compare_stop_width is not None:
        stop = _compare_pass(
            args, items, len(problems), settings, partial, first, steady, "stop",
            {"policy": _stop_policy(args.compare_stop_width)}, "steady_state_stop_rule",
            f"the sequential rule at {args.compare_stop_width:g}")
    if args.compare_candidate_hold is not None:
        hold = _compare_pass(
            args, items, len(problems), settings, partial, first, steady, "hold",
            {"candidate_hold": args.compare_candidate_hold}, "steady_state_candidate_hold",
            f"candidate_hold {args.compare_candidate_hold}")
    projection = project(first, steady) if first is not None else None
    _print_projection(projection)
    if args.json:
        args.json.write_text(json.dumps({"conditions": conditions, "first_use_included": first,
                                         "steady_state": steady, "projection": projection,
                                         "steady_state_stop_rule": stop,
                                         "compare_stop_width": args.compare_stop_width,
                                         "steady_state_candidate_hold": hold,
                                         "compare_candidate_hold":
                                             args.compare_candidate_hold},
                                        indent=2))
    return 0


def _compare_pass(args: argparse.Namespace, items: list[dict], n_problems: int,
                  settings: dict | None, partial, first: dict | None, steady: dict | None,
                  tag: str, change: dict, key: str, what: str) -> dict:
    """After the steady pass, the same batch again (fresh builds) with `change` to its
    settings, in the same warm process, kept workers and caches: the two steady rates side by
    side, one pass each."""
    from throughput import report, run_batch

    if steady is None:
        raise SystemExit(f"comparing {what} needs --steady or --steady-only")
    again = [{**it, "source": it["source"] + f"\n# {tag} pass {time.time_ns()}\n"}
             for it in items]
    res = run_batch(again, args.device, args.concurrency, args.rows,
                    {**(settings or {}), **change}, ahead=args.ahead, cache_dir=args.cache,
                    row_of=row_of, on_row=partial(key, first, steady))
    title = f"steady state, {what}"
    report(title, res, len(again))
    out = summarise(res, again, n_problems)
    _print(title, out)
    ratio = out["per_gpu_hour"] / steady["per_gpu_hour"] if steady["per_gpu_hour"] else None
    out["ratio_to_steady"] = ratio
    print(f"== {what}: {out['per_gpu_hour']:.0f} against {steady['per_gpu_hour']:.0f} per "
          f"GPU-hour in the steady pass ({ratio:.2f}x, same process, one pass each) ==")
    return out


def old_path(args: argparse.Namespace, problems: list[str]) -> int:
    """The old path's ratio (`--old-root`): the same subset through the other checkout and
    through this one, each in a process of its own on a fresh cache, first use included."""
    import tempfile

    from throughput import inner_run, old_api

    kinds = args.old_kinds.split(",")
    if unknown := sorted(set(kinds) - set(KINDS)):
        raise SystemExit(f"--old-kinds: unknown {unknown}; known: {', '.join(KINDS)}")
    items = batch(problems, kinds, args.size)
    figures: dict[str, dict] = {}
    with tempfile.TemporaryDirectory(prefix="kloop-old-path-") as tmp:
        path = Path(tmp) / "batch.json"
        path.write_text(json.dumps(items))
        for name, root, extra in (("old", args.old_root, ()),
                                  ("this", REPO, ("--warm-baselines",))):
            p = inner_run(root, path, args.device, args.concurrency, *extra)
            if p.returncode != 0:
                print(f"{name} path ({root}): failed ({p.returncode}); its output is above")
                return 1
            res = json.loads(p.stdout.strip().splitlines()[-1])
            figures[name] = summarise(res, items, len(problems))
            figures[name]["root"] = str(root.resolve())
            figures[name]["layout"] = "old (top-level evaluator)" if old_api(root.resolve()) \
                else "kloop"
            _print(f"{name} path ({root}), first use included", figures[name])
    ratio = figures["this"]["per_gpu_hour"] / figures["old"]["per_gpu_hour"] \
        if figures["old"]["per_gpu_hour"] else None
    print(f"== this checkout / the old path: {ratio:.2f}x candidates per GPU-hour "
          f"({len(items)} candidates on {len(problems)} problems, {args.size} sizes, "
          f"{args.concurrency} at once, each first use included, one after the other) ==")
    if args.json:
        args.json.write_text(json.dumps({"conditions": {
            "device": args.device, "concurrency": args.concurrency, "size": args.size,
            "problem_ids": problems, "kinds": kinds, "gpu": gpu_name(args.device),
            "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())},
            "old_path": figures["old"], "this_checkout": figures["this"], "ratio": ratio},
            indent=2))
    return 0


def _profile_judging() -> None:
    """The harness's judging of each trial message under cProfile (this process), printed at
    exit: its share of the lock hold (`trials_judged`)."""
    import atexit
    import cProfile
    import io
    import pstats
    import threading

    from kloop.evaluator.harness import judge

    lock, plain, profiles = threading.Lock(), judge._judge_trial, []

    def profiled(*a, **k):
        prof = cProfile.Profile()
        prof.enable()
        try:
            return plain(*a, **k)
        finally:
            prof.disable()
            with lock:
                profiles.append(prof)

    def report() -> None:
        if profiles:
            buf = io.StringIO()
            stats = pstats.Stats(profiles[0], stream=buf)
            for p in profiles[1:]:
                stats.add(p)
            stats.sort_stats("cumulative").print_stats(30)
            print(f"== the harness's judging of {len(profiles)} trial messages ==\n"
                  + buf.getvalue(), flush=True)

    judge._judge_trial = profiled
    atexit.register(report)


def _trace_to(path: Path) -> None:
    """The harness's per-message debug lines (`stages._trace`), with their time, to `path`."""
    handler = logging.FileHandler(path)
    handler.setFormatter(logging.Formatter("%(relativeCreated)d ms %(message)s"))
    logger = logging.getLogger("kloop.evaluator.harness.stages")
    logger.setLevel(logging.DEBUG)
    logger.addHandler(handler)


def _partial_writer(path: Path | None, conditions: dict, items: list[dict], problems: int):
    """`--json` rewritten after every finished candidate, marked `partial` (how many of the
    pass's candidates had finished): a part cut by its device call's time limit still leaves
    the figures of what it finished (its wall up to the last of them), which `--combine`
    refuses; the finished run writes the whole file over it."""

    def for_pass(name: str, first: dict | None = None, steady: dict | None = None):
        def write(res: dict) -> None:
            if path is None:
                return
            doc = {"conditions": conditions, "first_use_included": first, "steady_state": steady,
                   "projection": None,
                   "partial": {"pass": name, "finished": len(res["rows"]), "of": len(items)}}
            doc[name] = summarise(res, items, problems)
            tmp = path.with_suffix(path.suffix + ".tmp")
            tmp.write_text(json.dumps(doc, indent=2))
            tmp.replace(path)
        return write
    return for_pass


def _combined(files: list[Path], out: Path | None) -> int:
    try:
        data = combine([json.loads(f.read_text()) for f in files])
    except ValueError as exc:
        raise SystemExit(f"--combine: {exc}") from None
    c = data["conditions"]
    print(f"== {len(c['parts'])} parts ({', '.join(c['parts'])}) from {len(files)} files, each on a fresh cache; machines: "
          f"{', '.join(c['hosts'])} (parts at once on its host: {c['host_parts']}), "
          f"{c['device']}, {c['size']} sizes, "
          f"{c['concurrency']} at once ==")
    for name, label in (("first_use_included", "first use included (every part's)"),
                        ("steady_state", "steady state (baselines and caches warm, builds fresh)")):
        if data[name] is not None:
            _print(label, data[name])
    _print_projection(data["projection"])
    if out:
        out.write_text(json.dumps(data, indent=2))
    return 0


def _print_projection(projection: dict | None) -> None:
    if projection is not None:
        print(f"  projected {projection['projected']}: {projection['projected_wall_s'] / 3600:.2f}"
              f" h ({projection['first_use_per_problem_s']:.0f} s first use per problem, "
              f"{projection['steady_per_candidate_s']:.1f} s per candidate steady)")


if __name__ == "__main__":
    sys.exit(main())
