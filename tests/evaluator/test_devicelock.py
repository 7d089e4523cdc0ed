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

from kloop.evaluator.procs.devicelock import device_lock

_HOLDER = textwrap.dedent("""
    import sys, time
    from pathlib import Path
    from kloop.evaluator.procs.devicelock import device_lock
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


_ORDERED = textwrap.dedent("""
    import sys, time
    from pathlib import Path
    from kloop.evaluator.procs.devicelock import device_lock
    out, lock_dir, shared = sys.argv[1:4]
    Path(out + ".asking").write_text("")
    with device_lock("cuda:0", Path(lock_dir), shared=shared == "1"):
        start = time.time()
        while not Path(out + ".release").exists() and Path(out).name == "s1":
            time.sleep(0.01)
    Path(out).write_text(f"{start} {time.time()}")
""")


def _wait_for(path: Path, timeout: float = 60) -> None:
    end = time.time() + timeout
    while not path.exists():
        assert time.time() < end, f"{path} never appeared"
        time.sleep(0.01)


def test_a_waiting_exclusive_holder_lets_no_new_shared_holder_in(tmp_path):
    # s1 holds (until told); x asks and waits for it; s2 asks after x: it must wait for x too,
    # or a stream of shared holders would keep the clock out for ever. Each asks only once
    # the one before is blocked in its lock call (0.5 s after saying it asks: nothing else
    # lies between), so no timing of process starts decides the order.
    procs = {}
    for name, shared in (("s1", True), ("x", False), ("s2", True)):
        procs[name] = subprocess.Popen([sys.executable, "-c", _ORDERED, str(tmp_path / name),
                                        str(tmp_path / "locks"), "1" if shared else "0"])
        _wait_for(tmp_path / f"{name}.asking")
        time.sleep(0.5)
    (tmp_path / "s1.release").write_text("")
    assert [p.wait(timeout=60) for p in procs.values()] == [0, 0, 0]
    spans = {n: tuple(map(float, (tmp_path / n).read_text().split())) for n in procs}
    assert spans["s1"][1] <= spans["x"][0] + 0.01, spans
    assert spans["x"][1] <= spans["s2"][0] + 0.01, spans


_ACQUIRE = textwrap.dedent("""
    import sys
    from pathlib import Path
    from kloop.evaluator.procs.devicelock import device_lock
    device, lock_dir = sys.argv[1:3]
    with device_lock(device, Path(lock_dir) if lock_dir != "-" else None):
        pass
""")


def _acquires_in_another_process(device: str, lock_dir: Path, within_s: float = 20) -> None:
    """Fails with a message, not a hang, when another process cannot get `device` exclusively
    within `within_s` (a process start and one flock: well under a second on a quiet machine)."""
    p = subprocess.Popen([sys.executable, "-c", _ACQUIRE, device, str(lock_dir)])
    try:
        assert p.wait(timeout=within_s) == 0
    except subprocess.TimeoutExpired:
        p.kill()
        p.wait()
        pytest.fail(f"{device} in {lock_dir} stayed locked for {within_s:g} s")


def _acquires_in_another_thread(device: str, within_s: float = 10) -> bool:
    """Whether a thread of this process gets `device` (no lock dir) within `within_s`; one that
    does not stays blocked until the caller lets go."""
    got = threading.Event()

    def take() -> None:
        with device_lock(device, None):
            got.set()

    threading.Thread(target=take, daemon=True).start()
    return got.wait(within_s)


@pytest.mark.parametrize("shared", [True, False])
def test_a_holder_that_dies_gives_the_lock_back(tmp_path, shared):
    lock_dir = tmp_path / "locks"
    p = subprocess.Popen([sys.executable, "-c", _HOLDER, str(tmp_path / "dead"), str(lock_dir),
                          "1" if shared else "0", "60", "0"])
    deadline = time.time() + 30
    while not (tmp_path / "dead.in").exists():
        assert time.time() < deadline and p.poll() is None
        time.sleep(0.05)
    # While it lives, nobody else gets the device exclusively (else the check below shows
    # nothing)...
    blocked = subprocess.Popen([sys.executable, "-c", _ACQUIRE, "cuda:0", str(lock_dir)])
    with pytest.raises(subprocess.TimeoutExpired):
        blocked.wait(timeout=3)
    # ...and once it is killed, the one that waited gets it, and so does a newcomer.
    os.kill(p.pid, signal.SIGKILL)
    p.wait()
    try:
        assert blocked.wait(timeout=20) == 0, "the waiting holder failed"
    except subprocess.TimeoutExpired:
        blocked.kill()
        blocked.wait()
        pytest.fail("the lock of a killed holder was not given back within 20 s")
    _acquires_in_another_process("cuda:0", lock_dir)


def test_threads_of_one_process_follow_the_same_rules():
    spans: dict[str, tuple[float, float]] = {}
    release = threading.Event()

    def hold(name: str, shared: bool, seconds: float) -> None:
        with device_lock("cuda:7", None, shared=shared):
            start = time.time()
            if name == "s1":
                release.wait(30)
            time.sleep(seconds)
        spans[name] = (start, time.time())

    threads = []
    for args in [("s1", True, 0.0), ("s2", True, 0.3), ("x", False, 0.2), ("s3", True, 0.1)]:
        t = threading.Thread(target=hold, args=args)
        t.start()
        threads.append(t)
        time.sleep(0.3)  # each asks after the one before is holding or blocked
    release.set()
    for t in threads:
        t.join(timeout=30)
    assert _overlap(spans["s1"], spans["s2"]), spans
    for s in ("s1", "s2", "s3"):
        assert not _overlap(spans["x"], spans[s]), spans
    assert spans["x"][1] <= spans["s3"][0] + 0.01, spans


def test_cpu_is_never_locked(tmp_path):
    # The same device name on a GPU is locked (the contrast that makes the check below mean
    # something), "cpu" never is: not within one process, not across processes.
    with device_lock("cuda:5", None):
        assert not _acquires_in_another_thread("cuda:5", within_s=0.5)
    with device_lock("cpu", None):
        assert _acquires_in_another_thread("cpu"), "a second holder of cpu had to wait"
    with device_lock("cpu", tmp_path / "locks"):
        _acquires_in_another_process("cpu", tmp_path / "locks")
