"""Is the same forward slower under the candidate sandbox's identity (GPU machine, as root)?

    python bench/diag_uid.py [--calls 200]

The candidate process runs as uid 65534 with no_new_privs and no capabilities; the reference
worker runs as the harness (root). On the H200 the same code timed slower in the candidate
process with its own CUDA events (0.32 vs 0.075 ms for a batch-8 MLP, 4.05 vs 3.91 ms for L3/1),
with launches of a tiny op equally fast in both. Here each identity is a fresh interpreter that
imports torch, changes identity before CUDA starts, then times the same models with CUDA events in
process (L2 not flushed; the question is the difference between rows, not the absolute time).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
MODES = ["root", "nnp+nocaps", "uid65534", "uid65534+nnp+nocaps", "root-again"]


def become(mode: str) -> None:
    sys.path[:0] = [str(REPO)]
    from kloop.evaluator.procs import isolation

    if "uid65534" in mode:
        os.setgroups([])
        os.setgid(65534)
        os.setuid(65534)
    if "nnp" in mode:
        os.environ[isolation.CONFINE_ENV] = "caps"
        isolation.confine_child()


def child(mode: str, calls: int) -> None:
    # Imports first, as root, then the identity, then CUDA: what a candidate child does.
    sys.path[:0] = [str(REPO)]
    import torch
    from kloop.problems.registry import get_problem

    cases = [("L3/1-b8", "L3/1", {"batch_size": 8, "input_size": 1024, "layer_sizes": [1024],
                                  "output_size": 1024}),
             ("L3/1", "L3/1", {}), ("L3/4", "L3/4", {})]
    modules = {label: get_problem(pid).load_module(o) for label, pid, o in cases}
    become(mode)

    rows = {}
    ev = [torch.cuda.Event(enable_timing=True) for _ in range(2)]

    def time_it(fn, n: int) -> float:
        for _ in range(10):
            fn()
        torch.cuda.synchronize()
        out = []
        for _ in range(n):
            ev[0].record()
            fn()
            ev[1].record()
            ev[1].synchronize()
            out.append(ev[0].elapsed_time(ev[1]))
        return statistics.median(out)

    one = torch.zeros(1, device="cuda")
    rows["add x1 (launch)"] = time_it(lambda: one.add_(1), calls)
    for label, module in modules.items():
        torch.manual_seed(42)
        model = module.Model(*module.get_init_inputs()).cuda()
        inputs = [x.cuda() if isinstance(x, torch.Tensor) else x for x in module.get_inputs()]
        with torch.no_grad():
            rows[label] = time_it(lambda m=model, i=inputs: m(*i), calls)
    status = Path("/proc/self/status").read_text()
    keep = [ln for ln in status.splitlines()
            if ln.split(":")[0] in ("Uid", "NoNewPrivs", "CapEff", "Seccomp",
                                     "Speculation_Store_Bypass", "SpeculationIndirectBranch",
                                     "Cpus_allowed_list")]
    print(json.dumps({"mode": mode, "rows": rows, "status": keep}))


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--calls", type=int, default=200)
    ap.add_argument("--child")
    args = ap.parse_args()
    if args.child:
        child(args.child, args.calls)
        return 0
    results = []
    for mode in MODES:
        p = subprocess.run([sys.executable, __file__, "--child", mode, "--calls", str(args.calls)],
                           capture_output=True, text=True, cwd="/tmp")
        line = p.stdout.strip().splitlines()[-1:] if p.returncode == 0 else []
        if not line:
            print(f"{mode}: failed rc={p.returncode}: {p.stderr[-1500:]}")
            continue
        results.append(json.loads(line[0]))
    if not results:
        return 1
    labels = list(results[0]["rows"])
    print(f"{'mode':<22}" + "".join(f"{lab:>16}" for lab in labels) + "   (median ms, events)")
    for r in results:
        print(f"{r['mode']:<22}" + "".join(f"{r['rows'][lab]:>16.4f}" for lab in labels))
    for r in results:
        print(r["mode"], "|", "; ".join(s.replace("\t", " ") for s in r["status"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
