"""The trusted clock against real worker processes that try to fool it (no GPU needed).

Each test starts a worker process that serves calls through `evaluator.worker.serve.Server` on
fds made by `evaluator.harness.clock.CallChannel`, as the candidate process does, and misbehaves
the way native code could: clocks rewritten in its own process, replies written ahead, output
written after it answered, requests stolen by a thread, the shared memory resized."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest
import torch

from evaluator.harness.clock import CallChannel, ChannelBroken
from evaluator.harness.served import CallPlan, decode, run_plan
from evaluator.worker.serve import OK, ServeLayout

N = 64
LAYOUT = ServeLayout.of([([N], "torch.float32")])

WORKER = textwrap.dedent('''
    import ctypes, os, select, sys, threading, time
    import torch
    from evaluator.worker.serve import REPLY, OK, ServeLayout, Server

    req, rep, mem = (int(x) for x in sys.argv[1].split(","))
    mode = sys.argv[3]
    server = Server(req, rep, mem, ServeLayout.model_validate_json(sys.argv[2]), "cpu")

    def draw(seed):
        torch.manual_seed(seed)
        return [torch.randn(64)]

    def honest(x):
        return x * 2

    model = honest
    if mode == "sleepy_forged_clocks":
        real_sleep = time.sleep
        def model(x):
            real_sleep(0.03)
            return x * 2
        time.perf_counter = lambda: 0.0     # its own clocks say nothing happened
        time.monotonic = lambda: 0.0
    elif mode == "replies_ahead":
        for _ in range(20):
            os.write(rep, REPLY.pack(OK, 0.0))
    elif mode == "writes_after_reply":
        view = server.views[0]
        def model(x):
            out = torch.zeros(64)
            def later(v=x * 2):
                time.sleep(0.02)
                view.copy_(v)  # straight into the shared memory, after the reply
            threading.Thread(target=later).start()
            return out
    elif mode == "steals_requests":
        # A thread that answers every request at once (here the only reader, so it always
        # wins the race against the real server).
        def thief():
            while True:
                select.select([req], [], [])  # the server made the pipe non-blocking
                data = os.read(req, 16)
                if not data or data[0] == 4:
                    return
                os.write(rep, REPLY.pack(OK, 0.0))
        t = threading.Thread(target=thief)
        t.start()
        print("ready", flush=True)
        t.join()
        sys.exit(0)
    elif mode == "resizes_memory":
        try:
            os.ftruncate(mem, 16)
            print("shrunk", end=" ")
        except OSError as e:
            print("refused", e.errno, end=" ")
    print("ready", flush=True)
    server.serve(model, draw, lambda message, exc: None)
''')


def _expected(seed: int) -> torch.Tensor:
    torch.manual_seed(seed)
    return torch.randn(N) * 2


def _serve(mode: str, seeds: list[int], budget_s: float = 30.0):
    ch = CallChannel.open()
    ch.set_layout(LAYOUT)
    proc = subprocess.Popen(
        [sys.executable, "-c", WORKER, ",".join(map(str, ch.child_fds())),
         LAYOUT.model_dump_json(), mode],
        pass_fds=ch.child_fds(), stdout=subprocess.PIPE, text=True)
    ch.spawned()
    # Start calling once the worker has done its mischief (else a race decides the test).
    assert proc.stdout is not None
    first = proc.stdout.readline()
    judged: list[bool] = []

    def on_output(i, r):
        ok = r.status == OK and r.data is not None and torch.allclose(
            decode(LAYOUT, r.data)[0], _expected(seeds[i]))
        judged.append(ok)
        return True

    try:
        served = run_plan(ch, CallPlan(seeds=seeds, warmup_calls=1, warmup_ms=0.0, prep=True),
                          budget_s, on_output)
    finally:
        ch.stop()
        out = first + proc.communicate(timeout=30)[0]
        ch.close()
    return served, judged, out


def test_an_honest_worker_is_timed_and_every_output_checked():
    served, judged, _ = _serve("honest", [11, 12, 13, 14])
    assert judged == [True] * 4 and len(served.wall_ms) == 4
    assert all(0 < t < 1000 for t in served.wall_ms)


def test_clocks_rewritten_in_the_worker_do_not_move_the_harness_clock():
    served, judged, _ = _serve("sleepy_forged_clocks", [1, 2, 3])
    assert judged == [True] * 3
    assert min(served.wall_ms) >= 30.0  # the 30 ms of work is on the clock


def test_replies_written_ahead_of_their_requests_break_the_protocol():
    with pytest.raises(ChannelBroken) as e:
        _serve("replies_ahead", [1, 2])
    assert e.value.kind == "protocol"


def test_output_written_after_the_reply_is_not_what_is_judged():
    _, judged, _ = _serve("writes_after_reply", [5, 6, 7])
    assert judged == [False] * 3


def test_a_thread_that_answers_for_the_server_gets_stale_outputs():
    _, judged, _ = _serve("steals_requests", [21, 22, 23, 24, 25, 26])
    # The thief answers at once with whatever is in the shared memory: never this call's output.
    assert judged == [False] * 6


def test_the_shared_memory_cannot_be_resized_by_the_worker():
    _, judged, out = _serve("resizes_memory", [3])
    assert out.startswith("refused") and judged == [True]
