"""How the GPU shares itself between two processes' contexts, and what the quiet check sees.

    python bench/diag_timeslice.py [--spin-ms 50] [--probes 200]

A second process launches a spin of `--spin-ms` on the device on command. This process measures,
with nothing else on the device and then while that spin runs:
- the quiet check's probe (`serve.QUIET_PROBE_CYCLES` of `torch.cuda._sleep`, then a
  synchronisation): its wall time, one probe after another;
- a ~1 ms busy kernel's wall and CUDA-event time (how much another context's work slows ours);
- `Server.quiet` itself: how long it waits after the other process launched its spin.
Prints one line per figure; diagnostics, not a figure of record.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time

import numpy as np

OTHER = r"""
import sys, torch
torch.cuda.init(); torch.zeros(1, device="cuda"); torch.cuda.synchronize()
print("ready", flush=True)
for line in sys.stdin:
    torch.cuda._sleep(int(line))
    print("launched", flush=True)
    torch.cuda.synchronize()
    print("done", flush=True)
"""


def _pct(xs, q):
    return float(np.percentile(np.asarray(xs), q))


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--spin-ms", type=float, default=50.0)
    ap.add_argument("--probes", type=int, default=200)
    args = ap.parse_args()
    import torch

    from kloop.evaluator.worker import serve

    torch.zeros(1, device="cuda")
    cycles = int(args.spin_ms / 1000.0 * 1.98e9)  # at the H200's boost clock
    other = subprocess.Popen([sys.executable, "-c", OTHER], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True)
    assert other.stdout.readline().strip() == "ready"

    def probe() -> float:
        t0 = time.perf_counter()
        torch.cuda._sleep(serve.QUIET_PROBE_CYCLES)
        torch.cuda.synchronize()
        return (time.perf_counter() - t0) * 1000.0

    def busy() -> tuple[float, float]:
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        t0 = time.perf_counter()
        a.record()
        torch.cuda._sleep(2_000_000)
        b.record()
        torch.cuda.synchronize()
        return (time.perf_counter() - t0) * 1000.0, a.elapsed_time(b)

    def spin() -> None:
        other.stdin.write(f"{cycles}\n")
        other.stdin.flush()
        assert other.stdout.readline().strip() == "launched"

    def wait_done() -> None:
        assert other.stdout.readline().strip() == "done"

    for _ in range(20):
        probe(), busy()
    idle = [probe() for _ in range(args.probes)]
    print(f"probe alone: p50 {_pct(idle, 50):.3f} ms, p99 {_pct(idle, 99):.3f}, "
          f"max {max(idle):.3f} (QUIET_MS {serve.QUIET_MS})")
    bw = [busy() for _ in range(50)]
    print(f"busy 2M cycles alone: wall p50 {_pct([w for w, _ in bw], 50):.3f} ms, events p50 "
          f"{_pct([e for _, e in bw], 50):.3f} ms")

    spin()
    t0 = time.perf_counter()
    seq = []
    while (time.perf_counter() - t0) * 1000.0 < args.spin_ms * 3:
        seq.append(probe())
        if len(seq) > 5 and max(seq[-5:]) < serve.QUIET_MS:
            break
    wait_done()
    print(f"probes while the other spins {args.spin_ms:g} ms: {len(seq)} probes over "
          f"{(time.perf_counter() - t0) * 1000.0:.1f} ms; first 10: "
          + ", ".join(f"{x:.2f}" for x in seq[:10]))
    over = [x for x in seq if x >= serve.QUIET_MS]
    print(f"  probes at or over QUIET_MS: {len(over)}; p50 of those "
          f"{_pct(over, 50) if over else float('nan'):.3f} ms")

    spin()
    bs = [busy() for _ in range(10)]
    wait_done()
    print("busy 2M cycles while the other spins: wall " + ", ".join(f"{w:.2f}" for w, _ in bs)
          + " ms; events " + ", ".join(f"{e:.2f}" for _, e in bs))

    srv = serve.Server.__new__(serve.Server)  # only `quiet`, which reads nothing of the rest
    for launched_before in (True, False):
        if launched_before:
            spin()
        t0 = time.perf_counter()
        waited = srv.quiet()
        took = (time.perf_counter() - t0) * 1000.0
        if launched_before:
            wait_done()
        print(f"Server.quiet with {'a' if launched_before else 'no'} {args.spin_ms:g} ms spin "
              f"launched just before: waited {waited} ms, took {took:.2f} ms")
    other.stdin.close()
    other.wait(timeout=30)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
