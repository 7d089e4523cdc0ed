"""Where a custom-kernel candidate's probe trials spend their time (GPU machine).

    python bench/diag_ghost.py [--problems L3/1,L3/18] [--kinds reference,triton,cuda_lean]

On the H200 (2026-12-05, 653e30f, full sizes) the random trials of the figure of record's copy
candidates (`bench/experiment.py`: the reference with its output passed through a Triton or
CUDA copy kernel) took 2.1-4.6 s against 0.1-0.5 s for the reference itself, though only two
of the five trials differ: the first counts launches, the last is preceded by the ghost call.
Here each candidate runs the candidate process's own trial code (`worker.trials.run_trial`,
with kloop's build cache and probes) in a fresh process of its own, as a child would, after
the zygote's imports; each trial is timed, each under cProfile; the slowest one's top entries
are printed. Diagnostic only: nothing here judges a candidate.

Alone, the trials took 0.01-0.33 s (the H100, 2026-12-06 at 0cfd6db), the ghost trial 1.1-3.3 s
in the child under the lock (the H200, af624e7). The suspected difference: a lock holder's
threads are moved onto two serving cores with torch's default team of one thread per core of
the host. `--pin` moves this process there too; `--pin --threads 2` is what the candidate
child now gets (`state.lock_holder_threads`): its trials then took 0.26-1.76 s under the lock
on the H200 and the ghost trial 0.05-0.23 s on the H100 (2026-12-06).
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import os
import pstats
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "bench")]


def one(problem_id: str, kind: str, size: str, top: int, trials: int, device: str,
        pin: bool = False, threads: int | None = None) -> dict:
    """Run `kind`'s trials for `problem_id` in this process; what each trial cost. `pin`: the
    process's threads moved onto the serving cores before the trials, as a lock holder's are
    (`harness.cores`); `threads`: its intra-op CPU threads then (torch's default otherwise)."""
    from kloop.evaluator.worker.zygote import preload

    t0 = time.monotonic()
    preload()
    import torch
    from experiment import candidate

    from kloop.evaluator.common.backend import custom_kernel_names
    from kloop.evaluator.common.protocol import CandTrial, ProblemSpec
    from kloop.evaluator.tools.cli import problem_overrides
    from kloop.evaluator.worker.candidate import _install_build_cache
    from kloop.evaluator.worker.child import import_candidate
    from kloop.evaluator.worker.construct import construct, draw_inputs, init_inputs, load_problem
    from kloop.evaluator.worker.trials import Loaded, run_trial
    from kloop.problems.registry import get_problem

    out: dict = {"problem": problem_id, "kind": kind, "preload_s": time.monotonic() - t0}
    prob = get_problem(problem_id)
    work = Path(tempfile.mkdtemp(prefix="kloop-diag-ghost-"))
    source = candidate(prob.source, kind, prob.stem.split("_")[0])
    path = work / "candidate.py"
    path.write_text(source)
    spec = ProblemSpec(path=str(prob.path), sha256=prob.sha256,
                       overrides=problem_overrides(prob, size, []), device=device,
                       precision="fp32", allow_tf32=False)
    t = time.monotonic()
    torch.zeros(1, device=device)
    out["cuda_init_s"] = time.monotonic() - t
    _install_build_cache(str(work / "verified"), str(path), check_only=False)
    t = time.monotonic()
    module = import_candidate(str(path))
    out["import_s"] = time.monotonic() - t
    names = custom_kernel_names(source)
    problem = load_problem(spec)
    t = time.monotonic()
    model = construct(module.ModelNew, init_inputs(problem, spec), spec)
    if device == "cuda":
        torch.cuda.synchronize()
    out["construct_s"] = time.monotonic() - t
    loaded = Loaded(module, model, names)
    if pin:
        from kloop.evaluator.harness import cores

        quiet = cores.plan()
        if quiet is None:
            raise SystemExit("--pin: this host has no quiet-core plan (fewer than 8 cores)")
        cores.place(os.getpid(), quiet.serving)
        out["pinned_to"] = sorted(quiet.serving)
    if threads is not None:
        torch.set_num_threads(threads)
    out["intra_op_threads"] = torch.get_num_threads()
    backend = {"reference": "torch", "triton": "triton"}.get(kind, "cuda")
    kernels = backend != "torch"
    job = SimpleNamespace(problem=spec, backend=backend, tolerance=1e-4)
    plan = []
    for k in range(trials):
        torch.save(draw_inputs(problem, 1000 + k, spec), work / f"inputs_{k}.pt")
        plan.append(CandTrial(
            index=k, kind="random", forward_seed=k, inputs_path=str(work / f"inputs_{k}.pt"),
            output_path=str(work / f"output_{k}.pt"),
            repeat_output_path=str(work / "output_repeat.pt") if k == 0 else None,
            count_launches=kernels and k == 0, ghost=kernels and k == trials - 1))
    seconds, profiles = [], []
    for trial in plan:
        prof = cProfile.Profile()
        t = time.monotonic()
        prof.enable()
        msgs = run_trial(loaded, trial, job)
        prof.disable()
        seconds.append(round(time.monotonic() - t, 4))
        buf = io.StringIO()
        pstats.Stats(prof, stream=buf).sort_stats("cumulative").print_stats(top)
        profiles.append(buf.getvalue())
        out.setdefault("messages", []).append([m.model_dump_json()[:200] for m in msgs])
    profiled = profiles[max(range(len(seconds)), key=seconds.__getitem__)]
    out["trial_s"] = seconds
    out["profile"] = profiled
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--problems", default="L3/1,L3/18,L3/35")
    ap.add_argument("--kinds", default="reference,triton,cuda_lean")
    ap.add_argument("--size", choices=("full", "small"), default="full")
    ap.add_argument("--trials", type=int, default=5)
    ap.add_argument("--top", type=int, default=30)
    ap.add_argument("--device", default="cuda", help="cpu: a smoke test (Triton interpreted)")
    ap.add_argument("--out", type=Path, help="append each candidate's record (JSON lines)")
    ap.add_argument("--pin", action="store_true",
                    help="move the process onto the serving cores before its trials, as a lock "
                         "holder is moved (the suspected cause of the ghost trial's seconds)")
    ap.add_argument("--threads", type=int, help="intra-op CPU threads for the trials")
    ap.add_argument("--one", help="internal: PROBLEM:KIND in this process")
    args = ap.parse_args()
    if args.one:
        pid, kind = args.one.split(":")
        print(json.dumps(one(pid, kind, args.size, args.top, args.trials, args.device, args.pin, args.threads)))
        return 0
    for pid in args.problems.split(","):
        for kind in args.kinds.split(","):
            proc = subprocess.run(
                [sys.executable, __file__, "--one", f"{pid}:{kind}", "--size", args.size,
                 "--trials", str(args.trials), "--top", str(args.top), "--device", args.device,
                 *(["--pin"] if args.pin else []),
                 *(["--threads", str(args.threads)] if args.threads else [])],
                capture_output=True, text=True, timeout=600)
            if proc.returncode != 0:
                print(f"{pid} {kind}: exit {proc.returncode}\n{proc.stderr[-3000:]}", flush=True)
                continue
            rec = json.loads(proc.stdout.strip().splitlines()[-1])
            print(f"== {pid} {kind}: trials {rec['trial_s']} s; import {rec['import_s']:.2f} s, "
                  f"construct {rec['construct_s']:.2f} s; {rec['intra_op_threads']} intra-op "
                  f"threads{' on cores ' + str(rec['pinned_to']) if 'pinned_to' in rec else ''}",
                  flush=True)
            print(rec["profile"] or "", flush=True)
            if args.out:
                with open(args.out, "a") as f:
                    f.write(json.dumps(rec) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
