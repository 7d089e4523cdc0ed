"""The device lock's rules (`evaluator.procs.devicelock`), on CPU (it only looks at the device name):
one holder at a time per device (beside it only the kinds of hold the module lets share), across
processes and among the threads of one process, and a holder that dies gives the lock back."""

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
    out, lock_dir, hold = sys.argv[1:4]
    with device_lock("cuda:0", Path(lock_dir)):
        Path(out + ".in").write_text("")
        time.sleep(float(hold))
""")

_ACQUIRE = textwrap.dedent("""
    import sys
    from pathlib import Path
    from kloop.evaluator.procs.devicelock import device_lock
    device, lock_dir = sys.argv[1:3]
    with device_lock(device, Path(lock_dir)):
        pass
""")


def _acquires_in_another_process(device: str, lock_dir: Path, within_s: float = 20) -> None:
    """Fails with a message, not a hang, when another process cannot get `device` within
    `within_s` (a process start and one flock: well under a second on a quiet machine)."""
    p = subprocess.Popen([sys.executable, "-c", _ACQUIRE, device, str(lock_dir)])
    try:
        assert p.wait(timeout=within_s) == 0
    except subprocess.TimeoutExpired:
        p.kill()
        p.wait()
        pytest.fail(f"{device} in {lock_dir} stayed locked for {within_s:g} s")


def _acquires_in_another_thread(device: str, lock_dir: Path, within_s: float = 10) -> bool:
    """Whether a thread of this process gets `device` within `within_s`; one that does not
    stays blocked until the caller lets go."""
    got = threading.Event()

    def take() -> None:
        with device_lock(device, lock_dir):
            got.set()

    threading.Thread(target=take, daemon=True).start()
    return got.wait(within_s)


def test_a_holder_that_dies_gives_the_lock_back(tmp_path):
    lock_dir = tmp_path / "locks"
    p = subprocess.Popen([sys.executable, "-c", _HOLDER, str(tmp_path / "dead"), str(lock_dir),
                          "60"])
    deadline = time.time() + 30
    while not (tmp_path / "dead.in").exists():
        assert time.time() < deadline and p.poll() is None
        time.sleep(0.05)
    # While it lives, nobody else gets the device (else the check below shows nothing)...
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


def test_threads_of_one_process_hold_the_device_one_at_a_time(tmp_path):
    spans: dict[str, tuple[float, float]] = {}

    def hold(name: str) -> None:
        with device_lock("cuda:7", tmp_path / "locks"):
            start = time.time()
            time.sleep(0.3)
            spans[name] = (start, time.time())

    threads = [threading.Thread(target=hold, args=(n,)) for n in ("a", "b", "c")]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    ordered = sorted(spans.values())
    assert len(ordered) == 3, spans
    assert all(b[0] >= a[1] for a, b in zip(ordered, ordered[1:], strict=False)), spans


def test_cpu_is_never_locked(tmp_path):
    # The same lock on a GPU's name holds a second thread off (the contrast that makes the check
    # below mean something); "cpu" never does: not within one process, not across processes.
    locks = tmp_path / "locks"
    with device_lock("cuda:5", locks):
        assert not _acquires_in_another_thread("cuda:5", locks, within_s=0.5)
    with device_lock("cpu", locks):
        assert _acquires_in_another_thread("cpu", locks), "a second holder of cpu had to wait"
        _acquires_in_another_process("cpu", locks)


def _hold(name: str, lock_dir: Path, shared: bool, seconds: float,
          spans: dict[str, tuple[float, float]], entered: threading.Event | None = None) -> None:
    with device_lock("cuda:3", lock_dir, "shared" if shared else "exclusive"):
        start = time.time()
        if entered is not None:
            entered.set()
        time.sleep(seconds)
        spans[name] = (start, time.time())


def _announced(writers: Path, within_s: float = 10.0) -> None:
    """Wait until an exclusive holder has announced itself (a shared lock on the `.writers`
    file, which an exclusive attempt then cannot get)."""
    import fcntl

    deadline = time.time() + within_s
    while time.time() < deadline:
        if writers.exists():
            with open(writers, "a") as f:
                try:
                    fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    fcntl.flock(f, fcntl.LOCK_UN)
                except BlockingIOError:
                    return
        time.sleep(0.01)
    pytest.fail(f"no exclusive holder announced itself on {writers} within {within_s:g} s")


def _overlap(a: tuple[float, float], b: tuple[float, float]) -> bool:
    return a[0] < b[1] and b[0] < a[1]


def test_shared_holders_overlap_and_never_overlap_an_exclusive_one(tmp_path):
    locks = tmp_path / "locks"
    spans: dict[str, tuple[float, float]] = {}
    entered = [threading.Event() for _ in range(3)]
    readers = [threading.Thread(target=_hold, args=(f"r{i}", locks, True, 0.6, spans, e))
               for i, e in enumerate(entered)]
    for t in readers:
        t.start()
    # All three hold it before the exclusive one asks (one asking earlier goes first: the next
    # test).
    assert all(e.wait(10) for e in entered)
    writer = threading.Thread(target=_hold, args=("w", locks, False, 0.3, spans))
    writer.start()
    for t in [*readers, writer]:
        t.join(timeout=30)
    assert set(spans) == {"r0", "r1", "r2", "w"}, spans
    # The three shared holders ran at once (each holds 0.6 s; one after another would not
    # overlap at all), and the exclusive one beside none of them.
    assert _overlap(spans["r0"], spans["r1"]) and _overlap(spans["r1"], spans["r2"]), spans
    assert not any(_overlap(spans["w"], spans[r]) for r in ("r0", "r1", "r2")), spans


def test_a_waiting_exclusive_holder_goes_before_shared_ones_that_come_after_it(tmp_path):
    # A shared holder holds; an exclusive one waits for it; a second shared holder arrives: it
    # must not slip in beside the first (which would keep the exclusive one waiting as long as
    # shared holders keep coming), but wait until the exclusive one is done.
    locks = tmp_path / "locks"
    spans: dict[str, tuple[float, float]] = {}
    held = threading.Event()
    r1 = threading.Thread(target=_hold, args=("r1", locks, True, 1.0, spans, held))
    r1.start()
    assert held.wait(10)
    w = threading.Thread(target=_hold, args=("w", locks, False, 0.3, spans))
    w.start()
    _announced(locks / "cuda_3.writers")  # the exclusive one is waiting now
    r2 = threading.Thread(target=_hold, args=("r2", locks, True, 0.1, spans))
    r2.start()
    for t in (r1, w, r2):
        t.join(timeout=30)
    assert set(spans) == {"r1", "w", "r2"}, spans
    assert spans["w"][0] >= spans["r1"][1], spans
    assert spans["r2"][0] >= spans["w"][1], spans


def test_a_shared_holder_in_another_process_keeps_an_exclusive_one_out(tmp_path):
    # Shared holds are host-wide like exclusive ones: a process holding it shared blocks
    # another process's exclusive hold until it dies.
    lock_dir = tmp_path / "locks"
    code = _HOLDER.replace('device_lock("cuda:0", Path(lock_dir))',
                           'device_lock("cuda:0", Path(lock_dir), "shared")')
    assert code != _HOLDER
    p = subprocess.Popen([sys.executable, "-c", code, str(tmp_path / "sh"), str(lock_dir), "60"])
    deadline = time.time() + 30
    while not (tmp_path / "sh.in").exists():
        assert time.time() < deadline and p.poll() is None
        time.sleep(0.05)
    assert not _acquires_in_another_thread("cuda:0", lock_dir, within_s=1.0)
    os.kill(p.pid, signal.SIGKILL)
    p.wait()
    _acquires_in_another_process("cuda:0", lock_dir)


def _kind_hold(kind: str, lock_dir: Path, seconds: float, spans: dict,
               entered: threading.Event | None = None, upgrade_after: float | None = None,
               name: str | None = None) -> None:
    """Hold `cuda:4` as `kind` for `seconds`; a candidate upgrades after `upgrade_after` s and
    records when it was alone (`<name>.alone`)."""
    name = name or kind
    with device_lock("cuda:4", lock_dir, kind) as hold:
        start = time.time()
        if entered is not None:
            entered.set()
        if upgrade_after is not None:
            time.sleep(upgrade_after)
            hold.upgrade()
            assert hold.alone
            spans[f"{name}.alone"] = time.time()
        time.sleep(seconds)
        spans[name] = (start, time.time())


def test_outputs_only_workers_run_beside_a_candidates_trials_never_beside_its_timed_calls(
        tmp_path):
    # A candidate holds the device for its untimed start; an outputs-only reference worker
    # comes in beside it; the candidate's upgrade (before its first timed call) waits until
    # that worker is gone, and a worker that comes after the upgrade waits for the candidate's
    # end. The candidate never lets go of its hold in between.
    locks = tmp_path / "locks"
    spans: dict = {}
    in_cand = threading.Event()
    cand = threading.Thread(target=_kind_hold, args=("candidate", locks, 0.8, spans, in_cand,
                                                      0.3))
    cand.start()
    assert in_cand.wait(10)
    in_r1 = threading.Event()
    r1 = threading.Thread(target=_kind_hold, args=("shared", locks, 1.0, spans, in_r1),
                          kwargs={"name": "r1"})
    r1.start()
    assert in_r1.wait(5), "an outputs-only worker waited for a candidate's untimed start"
    cand.join(timeout=30)
    r1.join(timeout=30)
    # It waited for the worker to end (which also says the worker ran inside its hold).
    assert spans["candidate.alone"] >= spans["r1"][1], spans
    # After an upgrade, a new worker waits for the candidate's end.
    spans2: dict = {}
    up = threading.Event()
    cand2 = threading.Thread(target=_kind_hold, args=("candidate", locks, 0.8, spans2, up, 0.0))
    cand2.start()
    assert up.wait(10)
    time.sleep(0.1)  # upgraded (nothing else holds it)
    r2 = threading.Thread(target=_kind_hold, args=("shared", locks, 0.1, spans2),
                          kwargs={"name": "r2"})
    r2.start()
    for t in (cand2, r2):
        t.join(timeout=30)
    assert spans2["r2"][0] >= spans2["candidate"][1], spans2


@pytest.mark.parametrize("other", ["shared_trusted", "exclusive", "candidate"])
def test_a_candidates_untimed_start_is_never_beside_trusted_starts_timings_or_candidates(
        tmp_path, other):
    # A kept worker's start compiles (torch.compile times kernel choices), an exclusive holder
    # times, another candidate runs hostile code: none of them shares the device with a
    # candidate, even before its upgrade; both orders.
    locks = tmp_path / "locks"
    for first, second in (("candidate", other), (other, "candidate")):
        spans: dict = {}
        held = threading.Event()
        a = threading.Thread(target=_kind_hold, args=(first, locks, 0.6, spans, held),
                             kwargs={"name": "a"})
        a.start()
        assert held.wait(10)
        b = threading.Thread(target=_kind_hold, args=(second, locks, 0.1, spans),
                             kwargs={"name": "b"})
        b.start()
        for t in (a, b):
            t.join(timeout=30)
        assert spans["b"][0] >= spans["a"][1], (first, second, spans)


def test_a_candidates_upgrade_is_a_no_op_on_cpu_and_for_exclusive_and_trusted_holds(tmp_path):
    for device, kind in (("cpu", "candidate"), ("cuda:6", "exclusive"),
                         ("cuda:6", "shared"), ("cuda:6", "shared_trusted")):
        with device_lock(device, tmp_path / "locks", kind) as hold:
            assert hold.upgrade() == 0.0
            assert hold.alone == (device == "cpu" or kind == "exclusive"), (device, kind)
    # A candidate alone on a GPU becomes alone at once.
    with device_lock("cuda:6", tmp_path / "locks", "candidate") as hold:
        assert not hold.alone
        assert hold.upgrade() < 1.0 and hold.alone
