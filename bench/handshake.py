"""Where a served call's time goes (GPU machine): the trusted clock's handshake, phase by phase.

    python bench/handshake.py [--calls 60] [--gap-ms 5] [--busy-cycles 0] [--sizes 16K]

A worker process serves calls through the real `Server` and `CallChannel` (as a candidate
does); its model is `torch.cuda._sleep` for a known time followed by one elementwise op, so the
CUDA events around the forward are the truth the clock is held to. For each output size (16 KiB,
8 MiB, 64 MiB) and each snapshot mode of the harness (`sample`: 512 random lines inside the
clock, the whole output after it; `full`: the whole output inside the clock, as before), it
prints, per forward length: the median wall time, the median of the worker's events, the wall
time net of the fastest null call divided by the events (1.000 is perfect), and the median of
each phase of a call (request to the worker's wake-up, input draw, launch, output copy, reply to
the harness, the harness's snapshot). Timestamps are `time.perf_counter` in both processes
(CLOCK_MONOTONIC on Linux: one clock for both).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO)]

import numpy as np  # noqa: E402

SLEEP_MS = [0.0, 0.1, 1.0, 5.0, -1.0]
"""Forward lengths; -1: a 2048^2 float32 matmul instead of a sleep (its time, unlike a sleep's
cycle count, depends on the SM clock)."""
SIZES = {"16K": 4 << 10, "8M": 2 << 20, "64M": 16 << 20}  # float32 elements
PHASES = ["wake", "draw", "launch", "copy", "reply", "snapshot"]


def worker(fds: str, layout_json: str, stamps_path: str, device: str, busy: str) -> None:
    import math

    import torch
    from kloop.evaluator.worker.construct import seed_all
    from kloop.evaluator.worker.serve import ServeLayout, Server

    class Stamped(Server):
        """The real server, with a timestamp at each phase of a call."""

        cur: list[float] | None = None
        stamps: list[list[float]] = []

        def reply(self, status: int, event_ms: float = math.nan) -> None:
            if self.cur is not None:
                self.cur.append(time.perf_counter())
                self.stamps.append(self.cur)
                self.cur = None
            super().reply(status, event_ms)

        def _copy_out(self, outs):
            if self.cur is not None:
                self.cur.append(time.perf_counter())
            super()._copy_out(outs)
            if self.cur is not None:
                self.cur.append(time.perf_counter())

    server = Stamped(*(int(x) for x in fds.split(",")), ServeLayout.model_validate_json(layout_json),
                     device)
    if busy != "default":
        server.busy_cycles = int(busy)
    numel = server.views[0].numel()
    cycles_per_ms = 0.0
    if device == "cuda":
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda._sleep(1000)
        a.record()
        torch.cuda._sleep(10_000_000)
        b.record()
        b.synchronize()
        cycles_per_ms = 10_000_000 / a.elapsed_time(b)

    def draw(seed: int):
        server.cur = [time.perf_counter()]
        with torch.device(device):
            seed_all(seed)
            x = torch.randn(numel)
        server.cur.append(time.perf_counter())
        return [x, SLEEP_MS[seed & 0xFF]]

    w = torch.randn(2048, 2048, device=device)

    def model(x, ms):
        if ms < 0:
            torch.mm(w, w)
        elif ms and device == "cuda":
            torch.cuda._sleep(int(ms * cycles_per_ms))
        elif ms:  # a smoke run on CPU
            time.sleep(ms / 1000.0)
        return x * 2

    print(json.dumps({"pinned": server.pinned, "cycles_per_ms": cycles_per_ms}), flush=True)
    server.serve(model, draw, lambda message, exc: print("problem", message, exc, flush=True))
    Path(stamps_path).write_text(json.dumps(Stamped.stamps))


def run_size(label: str, numel: int, calls: int, device: str, busy: str,
             gap_ms: float) -> list[dict]:
    import secrets

    from kloop.evaluator.harness.clock import CallChannel
    from kloop.evaluator.worker.serve import ServeLayout

    class Timed(CallChannel):
        got: float = 0.0
        sent: float = 0.0

        def _send(self, op, seed):
            self.sent = time.perf_counter()
            super()._send(op, seed)

        def _wait(self, deadline):
            r = super()._wait(deadline)
            self.got = time.perf_counter()
            return r

    layout = ServeLayout.of([([numel], "torch.float32")])
    ch = Timed.open()
    ch.set_layout(layout)
    ch.spin = device == "cuda"
    stamps = Path(tempfile.mkdtemp()) / "stamps.json"
    proc = subprocess.Popen([sys.executable, __file__, "--worker", ",".join(map(str, ch.child_fds())),
                             layout.model_dump_json(), str(stamps), device, busy],
                            pass_fds=ch.child_fds(), stdout=subprocess.PIPE, text=True)
    ch.spawned()
    assert proc.stdout is not None
    info = json.loads(proc.stdout.readline())
    deadline = time.monotonic() + 600
    log = []  # (mode, kind, sleep index, sent, got, wall, event)

    def one(mode: str, kind: str, k: int) -> None:
        ch.full_snapshot_bytes = 1 << 62 if mode == "full" else 256 << 10
        if gap_ms:  # the harness judging the last output, as the evaluator does
            time.sleep(gap_ms / 1000.0)
        ch.prep(deadline)
        r = ch.call((secrets.randbits(48) << 8) | k, deadline, null=kind == "null")
        log.append((mode, kind, k, ch.sent, ch.got, r.wall_ms, r.event_ms))

    import gc
    for k in range(len(SLEEP_MS)):
        for _ in range(5):
            one("sample", "call", k)
    gc.collect()
    gc.disable()
    for mode in ("sample", "full"):
        for _ in range(calls):
            one(mode, "null", 0)
        for k in range(len(SLEEP_MS)):
            for _ in range(calls):
                one(mode, "call", k)
    gc.enable()
    ch.stop()
    proc.wait(timeout=60)
    ch.close()
    worker_stamps = json.loads(stamps.read_text())
    # Prep calls leave no stamps; every other call left one, in order.
    assert len(worker_stamps) == len(log), (len(worker_stamps), len(log))
    rows = []
    for mode in ("sample", "full"):
        picked = [(e, s) for e, s in zip(log, worker_stamps, strict=True) if e[0] == mode]
        nulls = [e[5] for e, _ in picked if e[1] == "null"]
        hs = min(nulls)
        groups = [("null", None)] + [("call", k) for k in range(len(SLEEP_MS))]
        for kind, k in groups:
            sel = [(e, s) for e, s in picked if e[1] == kind and (k is None or e[2] == k)]
            wall = np.array([e[5] for e, _ in sel])
            ev = [e[6] for e, _ in sel if e[6] is not None]
            phases = {name: [] for name in PHASES}
            for e, s in sel:
                t0, got = e[3], e[4]
                s_in, s_drawn = s[0], s[1]
                s_launched, s_copied, s_reply = s[-3], s[-2], s[-1]
                phases["wake"].append(s_in - t0)
                phases["draw"].append(s_drawn - s_in)
                phases["launch"].append(s_launched - s_drawn)
                phases["copy"].append(s_copied - s_launched)
                phases["reply"].append(got - s_reply)
                phases["snapshot"].append(t0 + e[5] / 1000.0 - got)
            ev_med = float(np.median(ev)) if ev else None
            net = float(np.median(wall)) - hs
            rows.append({
                "size": label, "mode": mode, "kind": kind,
                "sleep_ms": None if k is None else SLEEP_MS[k],
                "wall_med": float(np.median(wall)), "wall_p10": float(np.percentile(wall, 10)),
                "wall_p90": float(np.percentile(wall, 90)), "null_min": hs,
                "event_med": ev_med, "net_med": net,
                "net_over_events": None if not ev_med else net / ev_med,
                "cv": float(np.std(wall) / np.mean(wall)),
                **{f"{p}_us": float(np.median(v)) * 1e6 for p, v in phases.items()},
                "pinned": info["pinned"],
            })
    return rows


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--calls", type=int, default=60)
    ap.add_argument("--json", default=None)
    ap.add_argument("--device", default="cuda", help="cpu: a smoke run of the script itself")
    ap.add_argument("--pin", action="store_true",
                    help="pin this process and the worker to one core each")
    ap.add_argument("--busy-cycles", default="default",
                    help="the worker's busy phase in prep (SM cycles; 0: none)")
    ap.add_argument("--gap-ms", type=float, default=0.0,
                    help="the harness idles this long before each call (judging, in the evaluator)")
    ap.add_argument("--sizes", default=",".join(SIZES), help="output sizes to run")
    ap.add_argument("--worker", nargs=5)
    args = ap.parse_args()
    if args.worker:
        if os.environ.get("HANDSHAKE_PIN"):
            os.sched_setaffinity(0, {int(os.environ["HANDSHAKE_PIN"])})
        worker(*args.worker)
        return
    if args.pin:
        cores = sorted(os.sched_getaffinity(0))
        os.sched_setaffinity(0, {cores[len(cores) // 4]})
        os.environ["HANDSHAKE_PIN"] = str(cores[len(cores) // 2])
    rows = []
    for label, numel in SIZES.items():
        if label not in args.sizes.split(","):
            continue
        rows += run_size(label, numel, args.calls, args.device, args.busy_cycles, args.gap_ms)
    head = ("size mode   kind  sleep   wall med   p10-p90        null min  events   net/ev   cv   "
            + " ".join(f"{p:>8}" for p in PHASES) + "  (us)")
    print(head)
    for r in rows:
        sleep = "-" if r["sleep_ms"] is None else "mm" if r["sleep_ms"] < 0 else f"{r['sleep_ms']:g}"
        ev = "-" if r["event_med"] is None else f"{r['event_med']:.4f}"
        ratio = "-" if r["net_over_events"] is None else f"{r['net_over_events']:.3f}"
        print(f"{r['size']:>4} {r['mode']:6} {r['kind']:5} {sleep:>5} {r['wall_med']:9.4f} "
              f"{r['wall_p10']:7.4f}-{r['wall_p90']:7.4f} {r['null_min']:8.4f} {ev:>8} {ratio:>7} "
              f"{r['cv']:.3f} " + " ".join(f"{r[p + '_us']:8.1f}" for p in PHASES))
    print("pinned shared memory:", rows[0]["pinned"])
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
