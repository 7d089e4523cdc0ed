"""Where does a Triton candidate's first correctness trial spend its 5-7 s (GPU machine)?

    python bench/first_trial.py [--repeats 2]

On the H200 (2026-12-02 at 6b3972f) the first trial was most of a Triton candidate's time under the
exclusive device lock, with or without the JIT warm-up. It runs the candidate's first call
under torch.profiler (launch counting) and compiles its Triton kernels. This times the parts in
a fresh process each (fresh Triton cache, the children's TEARDOWN_CUPTI): CUDA init, the first
and a second profiler session around one small op, the first (cold JIT) and a later launch of a
Triton kernel, and a launch counted by Triton's launch hook instead of the profiler.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile

CHILD = r'''
import json, time
t = {}
t0 = time.perf_counter()
import torch
t["import_torch"] = time.perf_counter() - t0

def lap(name, fn):
    s = time.perf_counter(); fn(); torch.cuda.synchronize(); t[name] = time.perf_counter() - s

x = None
def init():
    global x
    x = torch.randn(1024, 1024, device="cuda")
lap("first_cuda_op", init)

s = time.perf_counter()
import triton, triton.language as tl
t["import_triton"] = time.perf_counter() - s

@triton.jit
def add_one(X, Y, N, BLOCK: tl.constexpr):
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(Y + i, tl.load(X + i, mask=i < N) + 1.0, mask=i < N)

y = torch.empty_like(x)
n = x.numel()
launch = lambda: add_one[(triton.cdiv(n, 1024),)](x, y, n, BLOCK=1024)
lap("triton_jit_1st", launch)
lap("triton_launch_2nd", launch)

from kloop.evaluator.worker.probes import hooked_triton_launches
with hooked_triton_launches({"add_one"}) as seen:
    lap("triton_launch_hooked", launch)
t["hook_count"] = seen.count
# What a later trial does: clone, compare, copy out, another forward.
def later():
    a = x.clone(); b = (a == x) | (a.isnan() & x.isnan()); bool(b.all()); a.cpu()
    launch()
lap("later_trial_ops", later)
s = time.perf_counter()
import torch.profiler
t["import_profiler"] = time.perf_counter() - s
s = time.perf_counter()
import torch._dynamo
t["import_dynamo"] = time.perf_counter() - s

def profiled():
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        y = x @ x
        torch.cuda.synchronize()
    prof.key_averages()
lap("profiler_1st", profiled)
lap("profiler_2nd", profiled)

lap("later_trial_ops_after_profiler", later)
t["triton"] = triton.__version__
print(json.dumps(t))
'''


def one() -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        # A file, not `-c`: @triton.jit reads its function's source.
        child = os.path.join(tmp, "child.py")
        with open(child, "w") as f:
            f.write(CHILD)
        env = {**os.environ, "TRITON_CACHE_DIR": os.path.join(tmp, "triton"),
               "TEARDOWN_CUPTI": "1"}
        out = subprocess.run([sys.executable, child], env=env, capture_output=True,
                             text=True, timeout=300)
    lines = [ln for ln in out.stdout.splitlines() if ln.startswith("{")]
    if not lines:
        raise RuntimeError(out.stderr[-3000:])
    return json.loads(lines[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=2)
    args = ap.parse_args()
    for i in range(args.repeats):
        r = one()
        print(f"run {i}: " + "  ".join(f"{k} {v:.3f}s" if isinstance(v, float) else f"{k} {v}"
                                       for k, v in r.items()), flush=True)


if __name__ == "__main__":
    main()
