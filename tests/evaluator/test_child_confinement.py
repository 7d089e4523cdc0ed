"""Children that run candidate code but are not started like the candidate child: the compile
child (outside the device lock, so it must not take CPU time from a timed process) and the ncu
pass's child (started by ncu, as the harness's own uid, so it must take on the sandbox identity
itself). Each test plants a probe in the candidate's module and reads what it saw."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from eval_helpers import candidate, cpu_config, drop_rows, light_cuda_candidate

from kloop.evaluator.harness.judge import candidate_job
from kloop.evaluator.harness.ledger import Ledger
from kloop.evaluator.harness.pipeline import evaluate
from kloop.evaluator.harness.stages import forward_command, reference_job
from kloop.evaluator.harness.state import EvalRun
from kloop.evaluator.procs import isolation
from kloop.problems.registry import get_problem

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="Linux scheduling and /proc")

PROBE = '''
import json as _j, os as _o
def _probe(log):
    st = open("/proc/self/status").read()
    field = {l.split(":")[0]: l.split()[1] for l in st.splitlines() if ":" in l and l.split()[1:]}
    seen = {"child": _o.path.basename(_o.getcwd()), "uid": _o.getuid(),
            "cap_eff": field.get("CapEff"), "no_new_privs": field.get("NoNewPrivs"),
            "policies": sorted({_o.sched_getscheduler(int(t)) for t in _o.listdir("/proc/self/task")})}
    for name, leave in [("other", lambda: _o.sched_setscheduler(0, _o.SCHED_OTHER, _o.sched_param(0))),
                        ("batch", lambda: _o.sched_setscheduler(0, _o.SCHED_BATCH, _o.sched_param(0))),
                        ("nice0", lambda: _o.setpriority(_o.PRIO_PROCESS, 0, 0))]:
        try:
            leave()
            seen[name] = _o.sched_getscheduler(0)
        except OSError as e:
            seen[name] = "refused"
    with open(f"{log}.{_o.getuid()}.{_o.urandom(6).hex()}", "w") as f:  # contained: all pid 1
        f.write(_j.dumps(seen))
'''


def _planted(source: str, log) -> str:
    return source.replace("import torch.nn as nn",
                          f"import torch.nn as nn\n{PROBE}\n_probe({str(log)!r})\n", 1)


def test_a_compile_child_runs_idle_and_cannot_leave_it(tmp_path, drop_box):
    """A CUDA candidate's module runs in the compile child (an nvcc check on CPU, a build on a
    GPU host) while other evaluations are timed: every thread of it is SCHED_IDLE, and neither
    SCHED_OTHER, SCHED_BATCH nor a normal nice value can be had back."""
    log = drop_box / "compile"
    r = evaluate("L3/1", _planted(light_cuda_candidate(), log),
                 cpu_config(tmp_path / "cache"))
    rows = [s for s in drop_rows(log) if s["child"] == "compile"]
    assert rows, (r.status, r.error, drop_rows(log))
    for s in rows:
        assert s["policies"] == [os.SCHED_IDLE], s
        assert s["other"] == s["batch"] == "refused", s
        assert s["nice0"] in ("refused", os.SCHED_IDLE), s  # a nice value is moot while idle


@pytest.mark.parametrize("mode", ["under_lock", "before_lock"])
def test_the_candidate_child_imports_idle_only_when_built_ahead(tmp_path, drop_box, mode):
    """Only children outside the lock are idle. The candidate child that imports its candidate
    under the lock (`construct_at: under_lock`) keeps its normal scheduling (or an honest
    timing would wait for every build on the host). Built ahead, it imports its candidate
    before the lock, like a compile child: idle, and it cannot take normal scheduling back
    itself (the harness does, once it holds the lock: tests/exploits/test_build_ahead.py)."""
    if mode == "before_lock" and not isolation.can_grant():
        pytest.skip("a root harness that can give the device back builds ahead")
    log = drop_box / "cand"
    r = evaluate("L3/1", _planted(candidate("mlp_torch.py"), log),
                 cpu_config(tmp_path / "cache", construct_at=mode))
    assert r.status == "correct", r.error
    rows = [s for s in drop_rows(log) if s["child"] == "cand"]
    want = os.SCHED_OTHER if mode == "under_lock" else os.SCHED_IDLE
    assert rows and all(s["policies"] == [want] for s in rows), rows
    if mode == "before_lock":
        assert all(s["other"] == s["batch"] == "refused" for s in rows), rows


def test_the_ncu_child_takes_on_the_sandbox_identity(tmp_path, drop_box):
    """ncu starts the forward child as the harness's uid (root on a GPU host); before any of the
    candidate's code runs it has the candidate child's identity: the sandbox uid where there is
    one, no capabilities where the plan drops them, and no_new_privs always."""
    log = drop_box / "forward"
    source = _planted(candidate("mlp_torch.py"), log)
    run = EvalRun.create(get_problem("L3/1"), source, cpu_config(tmp_path / "cache"))
    try:
        cand = run.root / "cand"
        (cand / "candidate.py").write_text(source)
        if run.sandbox is not None:
            isolation.give_to(run.sandbox, cand)
        job_path = cand / "job_forward.json"
        job_path.write_text(candidate_job(run, Ledger(run.root), reference_job(run),
                                          run.root / "build")
                            .model_dump_json())
        cmd, env = forward_command(run, job_path)
        done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr[-3000:]
        plan = run.sandbox
    finally:
        run.cleanup()
    (seen,) = drop_rows(log)
    assert seen["no_new_privs"] == "1", seen
    if plan is not None and plan.uid is not None:
        assert seen["uid"] == plan.uid, seen
    if plan is not None and (plan.uid is not None or plan.drop_caps):
        assert int(seen["cap_eff"], 16) == 0, seen
