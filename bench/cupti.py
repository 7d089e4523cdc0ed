"""Does a process stay slower after torch.profiler has run in it (GPU machine)?

    python bench/cupti.py

The candidate process counts its kernels under torch.profiler in its probe trials, then serves
the timed calls; the reference worker is never profiled. This times a launch-bound forward
(a small MLP: ~10 launches, ~0.05 ms) with CUDA events before and after one profiler session, in
a fresh process per setting of TEARDOWN_CUPTI, and prints the after/before ratio of the medians
(1.0: the profiler left nothing behind). The evaluator sets TEARDOWN_CUPTI=1 in every child.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

CHILD = r'''
import json, statistics, torch
from torch.profiler import ProfilerActivity, profile

model = torch.nn.Sequential(*[torch.nn.Linear(256, 256) for _ in range(5)]).cuda()
x = torch.randn(8, 256, device="cuda")

def times(n=300):
    out = []
    with torch.no_grad():
        for _ in range(n):
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            torch.cuda.synchronize()
            a.record(); model(x); b.record(); b.synchronize()
            out.append(a.elapsed_time(b))
    return statistics.median(out[50:])

before = times()
with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]):
    with torch.no_grad():
        model(x)
    torch.cuda.synchronize()
torch.cuda.synchronize()
after = times()
print(json.dumps({"before": before, "after": after}))
'''


def measure(teardown: str | None) -> dict:
    env = dict(os.environ)
    env.pop("TEARDOWN_CUPTI", None)
    if teardown is not None:
        env["TEARDOWN_CUPTI"] = teardown
    out = subprocess.run([sys.executable, "-c", CHILD], env=env, capture_output=True, text=True,
                         timeout=300)
    lines = [ln for ln in out.stdout.splitlines() if ln.startswith("{")]
    if not lines:
        raise RuntimeError(out.stderr[-2000:])
    return json.loads(lines[-1])


def main() -> None:
    print(f"{'TEARDOWN_CUPTI':>14} {'before ms':>10} {'after ms':>10} {'after/before':>12}")
    for setting in (None, "0", "1"):
        r = measure(setting)
        print(f"{setting or 'unset':>14} {r['before']:>10.4f} {r['after']:>10.4f} "
              f"{r['after'] / r['before']:>12.3f}", flush=True)


if __name__ == "__main__":
    main()
