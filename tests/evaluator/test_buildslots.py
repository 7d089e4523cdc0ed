"""Build slots (`evaluator.procs.buildslots`): at most `slots` compile children at once on the host,
across threads and processes; a dead holder's slot comes back."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from pathlib import Path

from kloop.evaluator.procs.buildslots import build_slot

REPO = Path(__file__).resolve().parents[2]


def test_no_more_than_the_slots_at_once_across_threads(tmp_path):
    inside, most, guard = 0, 0, threading.Lock()

    def build():
        nonlocal inside, most
        with build_slot(tmp_path, 2, poll_s=0.01):
            with guard:
                inside += 1
                most = max(most, inside)
            time.sleep(0.05)
            with guard:
                inside -= 1

    threads = [threading.Thread(target=build) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert most == 2 and inside == 0


def test_another_process_holds_a_slot_until_it_dies(tmp_path):
    holder = subprocess.Popen(
        [sys.executable, "-c",
         "import sys, time\nfrom pathlib import Path\nfrom kloop.evaluator.procs.buildslots import build_slot\n"
         f"with build_slot(Path({str(tmp_path)!r}), 1):\n    print('held', flush=True)\n"
         "    time.sleep(60)"],
        stdout=subprocess.PIPE, text=True, cwd=REPO)
    try:
        assert holder.stdout.readline().strip() == "held"
        got = []
        waiter = threading.Thread(target=lambda: got.append(
            build_slot(tmp_path, 1, poll_s=0.01).__enter__()))
        waiter.start()
        waiter.join(0.5)
        assert got == []  # still waiting
    finally:
        holder.kill()
        holder.wait()
    waiter.join(10)
    assert got == [0]
