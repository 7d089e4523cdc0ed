"""The harness's view of a child from /proc (`evaluator.procs.procwatch`): threads that live only
inside each call, the whole process's CPU time, and the widest CPU affinity of its threads."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

from kloop.evaluator.procs import procwatch

pytestmark = pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="needs /proc")

CALLS = textwrap.dedent('''
    import logging, logging.handlers, queue, sys, time
    helper = sys.argv[1] == "helper"
    print("ready", flush=True)
    sys.stdin.readline()
    for _ in range(300):  # one "call": a helper thread started and joined inside it
        if helper:
            listener = logging.handlers.QueueListener(queue.Queue())
            listener.start()
        t = time.perf_counter()
        while time.perf_counter() - t < 0.002:
            pass
        if helper:
            listener.stop()
    print("done", flush=True)  # the calls are over; the process stays till told to go
    sys.stdin.readline()
''')


def _child(*argv: str) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-c", CALLS, *argv], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "ready"
    return proc


@pytest.mark.parametrize("helper", [True, False], ids=["queue_listener", "control"])
def test_a_thread_joined_inside_every_call_is_seen_from_outside(helper):
    proc = _child("helper" if helper else "plain")
    sampler = procwatch.start(proc.pid)
    proc.stdin.write("go\n")
    proc.stdin.flush()
    assert proc.stdout.readline().strip() == "done"
    seen = sampler.stop()
    proc.communicate("exit\n", timeout=60)
    assert seen.samples > 10
    # Once every call has returned the helper is gone; sampled during the calls, it is not.
    # A joined thread's task can linger in /proc for a moment after `join` returns, beside the
    # next call's new one: three at most.
    if helper:
        assert 2 <= seen.max_threads <= 3, seen
    else:
        assert seen.max_threads == 1, seen
    assert seen.cpu_s is not None and seen.cpu_s >= 0.3, seen  # 300 calls of 2 ms busy work


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two CPUs")
def test_a_process_can_widen_its_own_affinity_and_the_widest_thread_is_seen():
    """Why the affinity a harness sets is not a limit by itself: a process may widen its own
    (any CPU of its cpuset) with no privilege. The sampler reports the widest thread."""
    allowed = sorted(os.sched_getaffinity(0))
    code = (f"import os, sys, time; os.sched_setaffinity(0, {{{allowed[0]}}}); "
            "print('ready', flush=True); sys.stdin.readline(); "
            f"os.sched_setaffinity(0, {set(allowed)!r}); time.sleep(0.3)")
    proc = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "ready"
    sampler = procwatch.start(proc.pid)
    proc.stdin.write("go\n")
    proc.stdin.flush()
    proc.wait(timeout=60)
    assert sampler.stop().max_cpus == len(allowed)


def test_a_stop_is_waited_for_until_every_thread_has_taken_it():
    """SIGSTOP is sent, not taken at once: `wait_stopped` returns once every thread of the
    process shows stopped, and names the ones still running when it gives up."""
    import signal

    code = ("import threading\n"
            "def spin():\n"
            "    while True: pass\n"
            "for _ in range(3): threading.Thread(target=spin, daemon=True).start()\n"
            "print('ready', flush=True)\n"
            "spin()\n")
    p = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert p.stdout.readline().strip() == "ready"
        running = procwatch.wait_stopped({p.pid}, 0.05)
        assert len(running) == 4, running  # not stopped: every spinning thread, after the limit
        os.kill(p.pid, signal.SIGSTOP)
        assert procwatch.wait_stopped({p.pid}, 5.0) == set()
        os.kill(p.pid, signal.SIGCONT)
        assert len(procwatch.wait_stopped({p.pid}, 0.05)) == 4
    finally:
        p.kill()
        p.wait()
