"""`kloop check`: the machine's isolation, row by row, and an exit status a script can use."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "agent"))
from agent_fakes import run_kloop  # noqa: E402

from evaluator import isolation  # noqa: E402
from problems.registry import get_problem  # noqa: E402


def test_check_reports_what_the_evaluator_would_apply_here(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))  # the default cache dir is under it
    res = run_kloop("check", "--device", "cpu", "--json")
    found = {r["name"]: r for r in json.loads(res.stdout)}
    root = isolation.can_change_uid()
    assert found["harness identity"]["ok"] is root
    assert found["containment"]["ok"] is isolation.work_parent(None)[1]
    plan = isolation.plan_sandbox(2_000_000_000, False, get_problem("L3/1").path,
                                  tmp_path / ".cache" / "kloop")
    assert found["sandbox uid"]["ok"] is (not plan.same_uid)
    assert found["devices"]["detail"] == "cpu" and found["NVML"]["ok"] is None
    isolation_ok = all(r["ok"] for r in found.values() if r["trust"])
    assert res.exit_code == (0 if isolation_ok else 1)
    if not root:  # as a normal user the answer must say how to get the sandbox
        assert "root" in found["harness identity"]["detail"]


def test_check_with_no_such_gpu_is_one_line(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    if os.path.exists("/dev/nvidia0"):
        pytest.skip("a GPU machine may have a cuda:3")
    res = run_kloop("check", "--device", "cuda:3", "--json")
    found = {r["name"]: r for r in json.loads(res.stdout)}
    assert found["devices"]["ok"] is False and "cuda:3" in found["devices"]["detail"]
