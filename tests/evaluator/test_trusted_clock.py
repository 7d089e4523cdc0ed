"""The trusted clock against real worker processes that try to fool it (no GPU needed).

Each test starts a worker process that serves calls through `evaluator.worker.serve.Server` on
fds made by `evaluator.harness.clock.CallChannel`, as the candidate process does, and misbehaves
the way native code could: clocks rewritten in its own process, replies written ahead, output
written after it answered, requests stolen by a thread, the shared memory resized."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time

import pytest
import torch

from kloop.evaluator.common.wire import OK, ServeLayout
from kloop.evaluator.harness.clock import CallChannel, ChannelBroken
from kloop.evaluator.harness.served import HANDSHAKE_JITTER_MS, CallPlan, run_plan

N = 64
LAYOUT = ServeLayout.of([([N], "torch.float32")])

WORKER = textwrap.dedent('''
    import ctypes, os, select, sys, threading, time
    import torch
    from kloop.evaluator.common.wire import REPLY, OK, ServeLayout
    from kloop.evaluator.worker.serve import Server

    req, rep, mem = (int(x) for x in sys.argv[1].split(","))
    mode = sys.argv[3]
    server = Server(req, rep, mem, ServeLayout.model_validate_json(sys.argv[2]), "cpu")

    numel = server.views[0].numel()

    def draw(seed):
        torch.manual_seed(seed)
        return [torch.randn(numel)]

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
            out = torch.zeros(numel)
            def later(v=x * 2):
                time.sleep(0.02)
                view.copy_(v)  # straight into the shared memory, after the reply
            threading.Thread(target=later).start()
            return out
    elif mode == "finishes_after_reply":
        # Answers at once and writes the output into the shared memory in chunks afterwards,
        # as a worker that skipped waiting for its copies would.
        view = server.views[0]
        def model(x):
            def later(v=x * 2):
                for c in range(0, numel, numel // 32):
                    view[c:c + numel // 32].copy_(v[c:c + numel // 32])
                    time.sleep(0.0005)
            threading.Thread(target=later).start()
            return view.clone()  # whatever the memory holds now
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


def _expected(seed: int, n: int = N) -> torch.Tensor:
    torch.manual_seed(seed)
    return torch.randn(n) * 2


def _serve(mode: str, seeds: list[int], budget_s: float = 30.0, layout: ServeLayout = LAYOUT,
           channel: type[CallChannel] = CallChannel, observe=None):
    """Serve `seeds` from a worker in `mode`; `observe(i)` (if given) runs as each output is
    judged, in the harness's judging code."""
    ch = channel.open()
    ch.set_layout(layout)
    n = layout.slots[0].nbytes // 4
    proc = subprocess.Popen(
        [sys.executable, "-c", WORKER, ",".join(map(str, ch.child_fds())),
         layout.model_dump_json(), mode],
        pass_fds=ch.child_fds(), stdout=subprocess.PIPE, text=True)
    ch.spawned()
    # Start calling once the worker has done its mischief (else a race decides the test).
    assert proc.stdout is not None
    first = proc.stdout.readline()
    judged: list[bool] = []

    def on_output(i, r):
        if observe is not None:
            observe(i)
        ok = r.status == OK and r.output is not None and torch.allclose(
            r.output.whole(0), _expected(seeds[i], n))
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


BIG = ServeLayout.of([([1 << 20], "torch.float32")])  # 4 MiB: sampled inside the clock


def test_a_large_output_is_judged_whole_and_snapshotted_by_samples():
    served, judged, _ = _serve("honest", [31, 32, 33, 34, 35], layout=BIG)
    assert judged == [True] * 5 and len(served.wall_ms) == 5


class _LateWrite(CallChannel):
    """The harness as it is, but one line of the output changes between the snapshot inside
    the clock and the copy after it: exactly what a worker that answered early and finished
    its output off the clock does, without the race that decides when."""

    calls = 0

    def _after(self):
        type(self).calls += 1
        if type(self).calls > 1:  # the warm-up call stays clean
            os.pwrite(self.mem, os.urandom(self.layout.total), 0)  # whichever lines were sampled
        return super()._after()


def test_output_that_changes_after_the_clock_stopped_breaks_the_protocol():
    with pytest.raises(ChannelBroken) as e:
        _serve("honest", [41, 42], layout=BIG, channel=_LateWrite)
    assert e.value.kind == "protocol" and "after it answered" in str(e.value)


class _WritesWhileJudged(CallChannel):
    """A large output that passes the clock's late-write check and is then overwritten with
    garbage while the harness judges it: what is judged must be what the clock stopped on."""

    def _after(self):
        out = super()._after()
        mem = self.mem

        class Changing(type(out)):
            def whole(self, k):
                os.pwrite(mem, os.urandom(self.layout.total), 0)
                return super().whole(k)

        return Changing(out.layout, out.buf)


def test_output_written_while_it_is_judged_changes_nothing_judged():
    served, judged, _ = _serve("honest", [43, 44, 45], layout=BIG, channel=_WritesWhileJudged)
    assert judged == [True] * 3 and len(served.wall_ms) == 3


def test_a_worker_that_finishes_its_output_after_answering_never_passes():
    try:
        _, judged, _ = _serve("finishes_after_reply", [51, 52, 53, 54, 55, 56], layout=BIG)
    except ChannelBroken as e:  # caught writing after the snapshot
        assert e.kind == "protocol"
    else:  # or the snapshot held its incomplete output
        assert not any(judged)


def test_a_handshake_measured_under_load_never_takes_a_call_below_its_work(tmp_path,
                                                                           monkeypatch):
    """The reference's null calls ran while the host was busy (modelled: each reads 15 ms more,
    in its own stage and in the paired rounds): taking that off a candidate's 20 ms calls would
    record 5 ms of work that took 20. The candidate process's own null calls of the same rounds
    bound what comes off its calls, so the record stays at 20 less the serving path's jitter:
    the fastest null call is a lower bound of a call's cost only to within that jitter (a CI
    host read 19.994 ms; unbounded it would read ~5)."""
    import dataclasses

    from eval_helpers import candidate, cpu_config

    from kloop.evaluator.harness import stages, timed
    from kloop.evaluator.harness.pipeline import evaluate

    real = stages.collect_reference

    def busy_host(*args, **kwargs):
        out = real(*args, **kwargs)
        out.handshake_ms = 15.0
        return out

    class BusyNulls:
        """The reference worker's channel, its null calls read 15 ms slower."""

        def __init__(self, channel):
            self._channel = channel

        def __getattr__(self, name):
            return getattr(self._channel, name)

        def call(self, seed, deadline, null=False, role=0, keep=True):
            r = self._channel.call(seed, deadline, null=null, role=role, keep=keep)
            return dataclasses.replace(r, wall_ms=r.wall_ms + 15.0) if null else r

    real_sides = timed._sides

    def busy_rounds(run, child, parked):
        return [dataclasses.replace(s, channel=BusyNulls(s.channel)) if s.name == "null" else s
                for s in real_sides(run, child, parked)]

    monkeypatch.setattr(stages, "collect_reference", busy_host)
    monkeypatch.setattr(timed, "_sides", busy_rounds)
    source = "import time\n" + candidate("mlp_torch.py").replace(
        "    def forward(self, x):", "    def forward(self, x):\n        time.sleep(0.02)", 1)
    r = evaluate("L3/1", source, cpu_config(tmp_path / "cache", cpu_timing_trials=3))
    assert r.status == "correct", (r.error, r.violations)
    assert r.paired is not None and r.paired.handshake_ms >= 15.0  # the busy reference's floor
    t = r.timing
    assert t is not None and t.handshake_ms is not None and t.handshake_ms < 15.0
    assert t.min_ms >= 20.0 - HANDSHAKE_JITTER_MS, t

class _CountsCopies(CallChannel):
    copies = 0

    def _after(self):
        type(self).copies += 1
        return super()._after()


def test_a_large_output_nobody_reads_is_not_copied_after_the_clock_and_the_clock_is_the_same():
    """`keep=False` (a baseline's or a null call's in the paired rounds): the sampled snapshot
    is still taken inside the clock; only the whole copy after it is skipped."""
    ch = _CountsCopies.open()
    ch.set_layout(BIG)
    proc = subprocess.Popen(
        [sys.executable, "-c", WORKER, ",".join(map(str, ch.child_fds())), BIG.model_dump_json(),
         "honest"], pass_fds=ch.child_fds(), stdout=subprocess.PIPE, text=True)
    ch.spawned()
    assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
    deadline = time.monotonic() + 60
    try:
        ch.prep(deadline)
        kept = ch.call(51, deadline)
        assert _CountsCopies.copies == 1 and kept.status == OK
        assert torch.allclose(kept.output.whole(0), _expected(51, 1 << 20))
        ch.prep(deadline)
        skipped = ch.call(52, deadline, keep=False)
        assert (skipped.status, skipped.output, _CountsCopies.copies) == (OK, None, 1)
        assert skipped.wall_ms > 0
    finally:
        ch.stop()
        proc.communicate(timeout=30)
        ch.close()
