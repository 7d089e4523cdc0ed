"""`kloop check`: the machine's isolation, row by row, and an exit status a script can use."""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "agent"))
from agent_fakes import run_kloop  # noqa: E402

from kloop.evaluator.procs import isolation  # noqa: E402
from kloop.problems.registry import get_problem  # noqa: E402


def test_check_reports_what_the_evaluator_would_apply_here(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))  # the default cache dir is under it
    res = run_kloop("check", "--device", "cpu", "--json", "--no-probe")
    found = {r["name"]: r for r in json.loads(res.stdout)}
    assert not any(name.startswith("probe") for name in found)
    root = isolation.can_change_uid()
    assert found["harness identity"]["ok"] is root
    assert found["containment"]["ok"] is isolation.work_parent(None)[1]
    plan = isolation.plan_sandbox(2_000_000_000, False, get_problem("L3/1").path)
    assert found["sandbox uid"]["ok"] is (not plan.same_uid)
    assert found["devices"]["detail"] == "cpu" and found["NVML"]["ok"] is None
    assert found["build ahead"]["ok"] is isolation.can_grant()
    isolation_ok = all(r["ok"] for r in found.values() if r["trust"])
    assert res.exit_code == (0 if isolation_ok else 1)
    if not root:  # as a normal user the answer must say how to get the sandbox
        assert "root" in found["harness identity"]["detail"]


@pytest.mark.skipif(not isolation.can_grant() or shutil.which("setpriv") is None,
                    reason="needs a root harness that can grant, and util-linux's setpriv")
def test_check_names_the_capability_a_harness_lacks_to_build_ahead(tmp_path):
    import subprocess

    code = ("import json; from kloop.evaluator.tools.trustcheck import rows; "
            "from kloop.evaluator.common.config import EvalConfig; "
            "from kloop.problems.registry import get_problem; "
            f"cfg = EvalConfig(device='cpu', cache_dir={str(tmp_path)!r}); "
            "r = {x.name: x for x in rows(cfg, get_problem('L3/1').path)}['build ahead']; "
            "print(json.dumps([r.ok, r.detail]))")
    out = subprocess.run(["setpriv", "--bounding-set", "-sys_nice", sys.executable, "-c", code],
                         capture_output=True, text=True, timeout=120,
                         cwd=Path(__file__).resolve().parents[2])
    assert out.returncode == 0, out.stderr[-2000:]
    ok, detail = json.loads(out.stdout.strip().splitlines()[-1])
    assert ok is False and detail.endswith("the harness lacks SYS_NICE"), detail


def test_check_with_no_such_gpu_is_one_line(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    if os.path.exists("/dev/nvidia0"):
        pytest.skip("a GPU machine may have a cuda:3")
    res = run_kloop("check", "--device", "cuda:3", "--json", "--no-probe")
    found = {r["name"]: r for r in json.loads(res.stdout)}
    assert found["devices"]["ok"] is False and "cuda:3" in found["devices"]["detail"]


def test_the_probe_reports_from_inside_and_catches_a_sandbox_that_is_not_there(tmp_path):
    """The probe is an evaluated candidate: what it reports is what candidate code gets. With
    no template process there is no containment (namespaces come from the template), and the
    probe says so instead of trusting the configuration."""
    from eval_helpers import MLP_SMALL, cpu_config, plain_start

    from kloop.evaluator.tools.trustcheck import probe

    contained = isolation.work_parent(None)[1]
    found = {r.name: r for r in probe(cpu_config(tmp_path / "cache"))}
    assert found["probe: no_new_privs"].ok
    assert found["probe: environment"].ok, found["probe: environment"].detail
    assert found["probe: other processes"].ok is contained
    assert found["probe: shared scratch"].ok is contained
    assert found["probe: network"].ok is contained, found["probe: network"].detail
    assert found["probe: file tree"].ok is contained, found["probe: file tree"].detail
    # /etc/shadow: covered for a contained child; unreadable by modes to a pool uid.
    assert found["probe: host files"].ok is (contained or os.geteuid() != 0)
    with plain_start():
        plain = {r.name: r for r in probe(cpu_config(tmp_path / "cache",
                                                     problem_overrides=MLP_SMALL))}
    assert plain["probe: other processes"].ok is False
    assert plain["probe: other processes"].detail.startswith("pid ")
    assert plain["probe: identity"].ok  # capabilities are dropped either way
    import socket

    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as k:  # the host's own answer
        try:
            k.connect(("192.0.2.1", 9))
            host_route = True
        except OSError:
            host_route = False
    assert plain["probe: network"].ok is (not host_route)


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs nvcc")
def test_check_says_whether_cuda_builds_can_be_lean_here():
    """The row a GPU host gets: nvcc's preprocessor lists the headers a lean build uses, as a
    build finds them (no GPU is needed to find them); off, or without a GPU, it does not apply."""
    from kloop.evaluator.common.config import EvalConfig
    from kloop.evaluator.tools.trustcheck import _lean_row

    row = _lean_row(EvalConfig(), on_gpu=True)
    assert row.ok is True and not row.trust, row
    assert "headers in place of <torch/types.h>" in row.detail
    assert _lean_row(EvalConfig(lean_cuda="off"), on_gpu=True).ok is None
    assert _lean_row(EvalConfig(), on_gpu=False).ok is None
