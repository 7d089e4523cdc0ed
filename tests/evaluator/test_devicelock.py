"""The device lock's rules (`evaluator.devicelock`), on CPU (it only looks at the device name):
shared holders run beside each other, an exclusive holder runs alone, a waiting exclusive holder
lets no new shared holder in, and a holder that dies gives the lock back. Across processes
(flock in a lock dir) and among the threads of one process (no lock dir)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from evaluator.devicelock import device_lock

_HOLDER = textwrap.dedent("""
    import sys, time
    from pathlib import Path
    from evaluator.devicelock import device_lock
    out, lock_dir, shared, hold, delay = sys.argv[1:6]
    time.sleep(float(delay))
    with device_lock("cuda:0", Path(lock_dir) if lock_dir != "-" else None, shared=shared == "1"):
        start = time.time()
        Path(out + ".in").write_text("")
        time.sleep(float(hold))
        end = time.time()
    Path(out).write_text(f"{start} {end}")
""")


def _run(tmp_path: Path, lock_dir: str, holders: list[tuple[str, bool, float, float]]) \
        -> dict[str, tuple[float, float]]:
    """holders: (name, shared, hold_s, start_delay_s) -> {name: (start, end)}"""
    procs = {name: subprocess.Popen([sys.executable, "-c", _HOLDER, str(tmp_path / name),
                                     lock_dir, "1" if shared else "0", str(hold), str(delay)])
             for name, shared, hold, delay in holders}
    assert [p.wait(timeout=60) for p in procs.values()] == [0] * len(procs)
    return {n: tuple(map(float, (tmp_path / n).read_text().split())) for n in procs}  # type: ignore[misc]


def _overlap(a: tuple[float, float], b: tuple[float, float]) -> bool:
    return a[0] < b[1] and b[0] < a[1]


def test_shared_holders_overlap_and_an_exclusive_one_runs_alone(tmp_path):
    spans = _run(tmp_path, str(tmp_path / "locks"),
                 [("s1", True, 1.5, 0), ("s2", True, 1.5, 0), ("x", False, 0.5, 0.6)])
    assert _overlap(spans["s1"], spans["s2"]), spans
    assert not _overlap(spans["x"], spans["s1"]) and not _overlap(spans["x"], spans["s2"]), spans


def test_a_waiting_exclusive_holder_lets_no_new_shared_holder_in(tmp_path):
    # s1 holds; x asks at 0.5 s and waits for s1; s2 asks at 1.0 s: it must wait for x too,
    # or a stream of shared holders would keep the clock out for ever.
    spans = _run(tmp_path, str(tmp_path / "locks"),
                 [("s1", True, 2.0, 0), ("x", False, 0.5, 0.5), ("s2", True, 0.2, 1.0)])
    assert spans["s1"][1] <= spans["x"][0] + 0.01, spans
    assert spans["x"][1] <= spans["s2"][0] + 0.01, spans


@pytest.mark.parametrize("shared", [True, False])
def test_a_holder_that_dies_gives_the_lock_back(tmp_path, shared):
    lock_dir = tmp_path / "locks"
    p = subprocess.Popen([sys.executable, "-c", _HOLDER, str(tmp_path / "dead"), str(lock_dir),
                          "1" if shared else "0", "60", "0"])
    deadline = time.time() + 30
    while not (tmp_path / "dead.in").exists():
        assert time.time() < deadline and p.poll() is None
        time.sleep(0.05)
    os.kill(p.pid, signal.SIGKILL)
    p.wait()
    t0 = time.time()
    with device_lock("cuda:0", lock_dir):
        pass
    assert time.time() - t0 < 5


def test_threads_of_one_process_follow_the_same_rules():
    spans: dict[str, tuple[float, float]] = {}

    def hold(name: str, shared: bool, seconds: float, delay: float) -> None:
        time.sleep(delay)
        with device_lock("cuda:7", None, shared=shared):
            start = time.time()
            time.sleep(seconds)
        spans[name] = (start, time.time())

    threads = [threading.Thread(target=hold, args=a) for a in
               [("s1", True, 1.0, 0), ("s2", True, 1.0, 0), ("x", False, 0.3, 0.3),
                ("s3", True, 0.1, 0.6)]]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert _overlap(spans["s1"], spans["s2"]), spans
    for s in ("s1", "s2", "s3"):
        assert not _overlap(spans["x"], spans[s]), spans
    assert spans["x"][1] <= spans["s3"][0] + 0.01, spans


def test_cpu_is_never_locked():
    with device_lock("cpu", None), device_lock("cpu", None):
        pass
