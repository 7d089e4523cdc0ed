"""One sandbox uid per evaluation in flight (`evaluator.procs.uidpool`): concurrent evaluations' candidate
code runs under different uids, so one cannot write into another's work dir or signal its
processes."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from eval_helpers import candidate, cpu_config, drop_rows

from kloop.evaluator.harness.pipeline import evaluate_many
from kloop.evaluator.procs import isolation, uidpool
from kloop.problems.registry import get_problem

BASE = 1_999_000_000  # far from the default pool, so a running kloop is not disturbed


def test_leases_in_flight_are_distinct_and_come_back_when_released():
    a, b = uidpool.lease(BASE, 3), uidpool.lease(BASE, 3)
    assert {a.uid, b.uid} == {BASE, BASE + 1}
    a.release()
    c = uidpool.lease(BASE, 3)
    assert c.uid == BASE
    b.release()
    c.release()


def test_a_uid_leased_by_another_process_is_not_handed_out_until_it_dies():
    holder = subprocess.Popen(
        [sys.executable, "-c",
         "import sys, time\nfrom kloop.evaluator.procs import uidpool\n"
         f"l = uidpool.lease({BASE + 10}, 2)\nprint(l.uid, flush=True)\ntime.sleep(60)"],
        stdout=subprocess.PIPE, text=True, cwd=Path(__file__).resolve().parents[2])
    try:
        assert int(holder.stdout.readline()) == BASE + 10
        mine = uidpool.lease(BASE + 10, 2)
        assert mine.uid == BASE + 11
        with pytest.raises(RuntimeError, match="stayed leased"):
            uidpool.lease(BASE + 10, 2, wait_s=0.2)
    finally:
        holder.kill()
        holder.wait()
    again = uidpool.lease(BASE + 10, 2, wait_s=5)  # the dead holder's lock went with it
    assert again.uid == BASE + 10
    again.release()
    mine.release()


def test_a_lease_dir_someone_else_made_is_not_trusted(tmp_path, monkeypatch):
    if os.geteuid() != 0:
        pytest.skip("needs root to make a directory another uid owns")
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    squat = tmp_path / "kloop-uid-leases"
    squat.mkdir(mode=0o777)
    os.chown(squat, 12345, 12345)
    assert uidpool.lease_dir() is None
    a, b = uidpool.lease(BASE + 20, 2), uidpool.lease(BASE + 20, 2)  # still distinct here
    assert a.uid != b.uid and a.fd is None
    a.release()
    b.release()


ATTACK = '''
import json as _j, os as _o, signal as _s, time as _t
def _attack(log, hostile):
    seen = []
    me = _o.getuid()
    if hostile:
        parent = _o.path.dirname(_o.path.dirname(_o.getcwd()))
        try:
            names = _o.listdir(parent)
        except OSError as e:
            names = []
            seen.append(["list refused", e.errno])
        for name in names:
            cand = _o.path.join(parent, name, "cand")
            if _o.path.realpath(cand) == _o.path.realpath(_o.getcwd()):
                continue
            try:
                with open(_o.path.join(cand, "planted.txt"), "w") as f:
                    f.write("x")
                seen.append(["wrote", cand])
            except OSError as e:
                seen.append(["write refused", e.errno])
        for pid in _o.listdir("/proc"):
            if not pid.isdigit() or int(pid) == _o.getpid():
                continue
            try:
                uid = int(open(f"/proc/{pid}/status").read().split("Uid:")[1].split()[0])
            except (OSError, IndexError, ValueError):
                continue
            if uid != me and uid >= 1_000_000_000:
                try:
                    _o.kill(int(pid), _s.SIGSTOP)
                    seen.append(["stopped", int(pid)])
                except OSError as e:
                    seen.append(["signal refused", e.errno])
    with open(f"{log}.{me}", "a") as f:  # a file per uid: another uid's is not ours to append to
        f.write(_j.dumps({"uid": me, "child": _o.path.basename(_o.getcwd()),
                          "hostile": hostile, "seen": seen}) + "\\n")
'''


@pytest.mark.gpu  # needs the uid sandbox: a root harness whose Python any uid can reach (the H200)
def test_concurrent_candidates_cannot_touch_each_other(tmp_path, drop_box):
    """Three CUDA evaluations at once: each one's candidate code runs under a uid of its own,
    and the hostile one, looking for the others' dirs and processes for 10 s, changes nothing
    (where the harness contains children it does not even see them: test_containment.py)."""
    plan = isolation.plan_sandbox(1_000_000_000, False, get_problem("L3/1").path)
    if plan.uid is None:
        pytest.skip(f"no uid sandbox here: {plan.reason}")
    log = drop_box / "attack.jsonl"

    def planted(hostile: bool) -> str:
        loop = (f"for _ in range(20):\n    _attack({str(log)!r}, True)\n    _t.sleep(0.5)\n"
                if hostile else f"_attack({str(log)!r}, False)\n")
        return candidate("mlp_torch.py").replace(
            "import torch.nn as nn", f"import torch.nn as nn\n{ATTACK}\n{loop}", 1)

    cfg = cpu_config(tmp_path / "cache", device="cuda", sandbox_uid=1_000_000_000,
                     sandbox_uids=4)
    results = evaluate_many([("L3/1", planted(True)), ("L3/1", planted(False)),
                             ("L3/1", planted(False))], cfg, max_workers=3)
    assert [r.status for r in results[1:]] == ["correct", "correct"], [r.error for r in results]
    rows = drop_rows(log)
    cand_uids = {r["uid"] for r in rows if r["child"] == "cand"}
    assert len(cand_uids) == 3 and min(cand_uids) >= 1_000_000_000, rows
    actions = [a for r in rows for a in r["seen"]]
    assert not [a for a in actions if a[0] in ("wrote", "stopped")], actions


def test_an_evaluation_holds_its_uid_until_cleanup(tmp_path):
    from kloop.evaluator.harness.state import EvalRun

    cfg = cpu_config(tmp_path / "cache", sandbox_uid=BASE + 30, sandbox_uids=2)
    run = EvalRun.create(get_problem("L3/1"), "", cfg)
    try:
        if run.sandbox is not None and run.sandbox.uid is not None:
            assert run.lease is not None and run.lease.uid == run.sandbox.uid
            assert run.sandbox.uid in uidpool._held
            for sub in ("cand", "compile", "triton"):
                if (run.root / sub).stat().st_uid == run.sandbox.uid:
                    assert (run.root / sub).stat().st_mode & 0o077 == 0
        else:  # no uid sandbox on this machine: nothing is held for it
            assert run.lease is None and not {BASE + 30, BASE + 31} & uidpool._held
    finally:
        run.cleanup()
    assert run.lease is None and not {BASE + 30, BASE + 31} & uidpool._held
