"""A candidate child built ahead (`EvalConfig.construct_at`): it imports the candidate and builds
its models before the device lock, kept from the device (its nodes covered by /dev/null in its
mount namespace) and at SCHED_IDLE, and gets both back only once the harness holds the lock.

Here the device is a file of the test's (`hidden_from_builds`): hidden from the child before the
lock as the GPU's nodes are, and given back the same way. What the candidate's own code saw,
before the lock and after it, is in the drop box. The GPU's own nodes: `test_gpu_candidates.py`.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from eval_helpers import cpu_config, drop_rows

from evaluator import forkserver, isolation
from evaluator.pipeline import evaluate

pytestmark = pytest.mark.skipif(
    not (forkserver.usable() and isolation.can_grant()),
    reason="needs a root harness with the capabilities to give the device back, and the "
           "template process")

# The facts every probe leaves: where it ran, what the hidden file read as, its scheduling
# policy. `SEEN` and `FILE` are filled in per test.
PROBE = textwrap.dedent('''\
    import json, os
    import torch.nn as nn
    import torch.nn.functional as F

    SEEN, FILE = {seen!r}, {file!r}

    def facts(where, **more):
        try:
            with open(FILE) as f:
                text = f.read()
        except OSError as e:
            text = f"error {{e.errno}}"
        row = dict(where=where, text=text, policy=os.sched_getscheduler(0), **more)
        with open(f"{{SEEN}}.{{os.getpid()}}.{{os.getuid()}}", "a") as f:
            f.write(json.dumps(row) + "\\n")
        return text

    {extra}

    class ModelNew(nn.Module):
        def __init__(self, input_size, layer_sizes, output_size):
            super().__init__()
            text = facts("init", **attack())
            {init_check}
            layers, current = [], input_size
            for hidden in layer_sizes:
                layers += [nn.Linear(current, hidden), nn.ReLU()]
                current = hidden
            layers.append(nn.Linear(current, output_size))
            self.network = nn.Sequential(*layers)
            self.told = False

        def forward(self, x):
            if not self.told:
                self.told = True
                facts("forward")
            return self.network(x)
''')

NO_ATTACK = "def attack():\n    return {}"

# The cheapest ways out before the lock, each tried from the constructor: uncover the file
# itself, leave SCHED_IDLE, raise the nice limit that keeps it there, read the file through
# another path, or cover it again from a user namespace of its own and uncover that.
ATTACK = textwrap.dedent('''\
    import ctypes, resource

    def attack():
        libc = ctypes.CDLL(None, use_errno=True)
        out = {}
        out["umount"] = libc.umount2(FILE.encode(), 2) == 0
        try:
            os.sched_setscheduler(0, os.SCHED_OTHER, os.sched_param(0))
            out["sched_other"] = True
        except OSError:
            out["sched_other"] = False
        try:
            resource.setrlimit(resource.RLIMIT_NICE, (20, 20))
            out["nice_limit"] = True
        except (OSError, ValueError):
            out["nice_limit"] = False
        out["via_proc"] = []
        for path in (f"/proc/self/root{FILE}", f"/proc/1/root{FILE}",
                     f"/proc/{os.getppid()}/root{FILE}"):
            try:
                with open(path) as f:
                    out["via_proc"].append(f.read())
            except OSError:
                pass
        # In a single-threaded fork (a threaded process cannot enter a user namespace), under a
        # name the static rules do not read: they are not what stops it.
        r, w = os.pipe()
        pid = getattr(os, "fo" + "rk")()
        if pid == 0:
            got = b"no userns"
            if libc.unshare(0x10000000 | 0x00020000) == 0:  # CLONE_NEWUSER | CLONE_NEWNS
                got = b"umounted" if libc.umount2(FILE.encode(), 2) == 0 else b"refused"
            os.write(w, got)
            os._exit(0)
        os.close(w)
        out["userns"] = os.read(r, 100).decode()
        os.waitpid(pid, 0)
        return out
''')


def _source(drop_box, secret, extra=NO_ATTACK, init_check="pass") -> str:
    return PROBE.format(seen=str(drop_box / "seen"), file=str(secret), extra=extra,
                        init_check=init_check)


@pytest.fixture
def secret(drop_box):
    """The stand-in for the GPU's device nodes: readable by the child once it holds the lock."""
    path = drop_box / "device"
    path.write_text("REAL")
    path.chmod(0o644)
    return path


def _config(tmp_path, secret, mode, **more):
    return cpu_config(tmp_path / "cache", construct_at=mode, hidden_from_builds=[str(secret)],
                      **more)


def test_a_model_built_ahead_is_kept_from_the_device_until_the_lock(tmp_path, drop_box, secret):
    r = evaluate("L3/1", _source(drop_box, secret), _config(tmp_path, secret, "before_lock"))
    assert r.status == "correct", r.error
    assert not any(f.startswith("constructed_under_lock") for f in r.flags), r.flags
    rows = drop_rows(drop_box / "seen")
    init = [x for x in rows if x["where"] == "init"]
    forward = [x for x in rows if x["where"] == "forward"]
    # Built before the lock: the file was /dev/null, and the process was at SCHED_IDLE.
    assert init and all(x["text"] == "" and x["policy"] == os.SCHED_IDLE for x in init), init
    # Once the harness held the lock: the file's own content, at SCHED_OTHER.
    assert forward and all(x["text"] == "REAL" and x["policy"] == os.SCHED_OTHER
                           for x in forward), forward
    # The whole load stage under the lock is now a move of the built model.
    assert r.stage_seconds.get("load", 0.0) < 1.0, r.stage_seconds


def test_under_lock_builds_with_the_device_in_reach(tmp_path, drop_box, secret):
    r = evaluate("L3/1", _source(drop_box, secret), _config(tmp_path, secret, "under_lock"))
    assert r.status == "correct", r.error
    rows = drop_rows(drop_box / "seen")
    assert rows and all(x["text"] == "REAL" and x["policy"] == os.SCHED_OTHER
                        for x in rows), rows


def test_a_constructor_that_needs_the_device_is_built_again_under_the_lock(
        tmp_path, drop_box, secret):
    """Unusual honest code: its constructor needs what is hidden before the lock (on a GPU, a
    constructor that makes a CUDA tensor). It is judged as it would be without `construct_at`,
    and the result says it was built again."""
    check = 'if text != "REAL":\n                raise RuntimeError("no device here")'
    r = evaluate("L3/1", _source(drop_box, secret, init_check=check),
                 _config(tmp_path, secret, "before_lock"))
    assert r.status == "correct", r.error
    flags = [f for f in r.flags if f.startswith("constructed_under_lock")]
    assert len(flags) == 1 and "no device here" in flags[0], r.flags
    init = [x for x in drop_rows(drop_box / "seen") if x["where"] == "init"]
    # Once before the lock (it raised), then under it: the main model and the reparam
    # trial's second one, as without `construct_at`.
    seen = [(x["text"], x["policy"]) for x in init]
    assert seen[0] == ("", os.SCHED_IDLE) and len(seen) > 1, init
    assert all(x == ("REAL", os.SCHED_OTHER) for x in seen[1:]), init


def test_a_broken_constructor_gets_the_same_verdict_either_way(tmp_path, drop_box, secret):
    check = 'raise ValueError("broken for good")'
    verdicts = {}
    for mode in ("before_lock", "under_lock"):
        r = evaluate("L3/1", _source(drop_box, secret, init_check=check),
                     _config(tmp_path, secret, mode))
        verdicts[mode] = (r.status, r.stage_reached, r.error and r.error.type)
    assert verdicts["before_lock"] == verdicts["under_lock"] == \
        ("runtime_error", "load", "ValueError"), verdicts


def test_candidate_code_before_the_lock_cannot_reach_the_device_or_leave_idle(
        tmp_path, drop_box, secret):
    r = evaluate("L3/1", _source(drop_box, secret, extra=ATTACK),
                 _config(tmp_path, secret, "before_lock"))
    init = [x for x in drop_rows(drop_box / "seen") if x["where"] == "init"]
    assert init, r.flags
    first = init[0]
    assert first["policy"] == os.SCHED_IDLE and first["text"] == "", first
    assert not first["umount"] and not first["sched_other"] and not first["nice_limit"], first
    assert all(text in ("",) for text in first["via_proc"]), first
    # Its own user namespace: the covering mount is locked there, it cannot be taken off.
    assert first["userns"] in ("no userns", "refused"), first
    # It gained nothing, and lost nothing either: judged as any honest MLP.
    assert r.status == "correct", r.error


@pytest.mark.skipif(shutil.which("setpriv") is None, reason="needs util-linux's setpriv")
@pytest.mark.parametrize("cap", ["sys_nice", "sys_admin", "sys_ptrace", "sys_chroot"])
def test_a_root_harness_without_a_capability_it_needs_builds_under_the_lock(cap, tmp_path):
    """Root in a container often lacks some (Docker's default set has none of these four): such
    a harness never builds ahead, where it could neither uncover the device nor restore the
    child's priority (every candidate would be built twice)."""
    code = ("from evaluator import isolation; from evaluator.stages import construct_ahead; "
            "from evaluator.state import EvalRun; from problems.registry import get_problem; "
            "import sys; sys.path.insert(0, 'tests/evaluator'); "
            "from eval_helpers import cpu_config; from pathlib import Path; "
            f"run = EvalRun.create(get_problem('L3/1'), '', cpu_config(Path({str(tmp_path)!r}))); "
            "print(isolation.can_grant(), construct_ahead(run), run.flags); run.cleanup()")
    for drop, want in ((f"-{cap}", "False"), ("+all", "True")):
        out = subprocess.run(["setpriv", "--bounding-set", drop, sys.executable, "-c", code],
                             capture_output=True, text=True, timeout=120,
                             cwd=Path(__file__).resolve().parents[2])
        assert out.returncode == 0, out.stderr[-2000:]
        assert out.stdout.split()[:2] == [want, want], (drop, out.stdout)


def test_a_retry_names_the_first_cuda_query_made_before_the_lock():
    """What a retry's flag says about its cause: the first `torch.cuda` query made while the
    build ahead ran, where it was made; the functions are torch's own again afterwards."""
    import torch

    from evaluator.worker.ahead import CudaQueries

    before = torch.cuda.is_available
    CudaQueries.first = None
    with CudaQueries.watched():
        torch.cuda.device_count()  # this line is the one named
        line = __import__("inspect").currentframe().f_lineno - 1
        torch.cuda.is_available()
    assert CudaQueries.first == f"torch.cuda.device_count() at {__file__}:{line}"
    assert torch.cuda.is_available is before


# ---- on the GPU: its own device nodes --------------------------------------------------------

GPU_PROBE = textwrap.dedent('''\
    import ctypes, json, os
    import torch
    import torch.nn as nn

    SEEN = {seen!r}

    def note(**row):
        try:
            row["ctl_rdev"] = os.stat("/dev/nvidiactl").st_rdev
        except OSError:
            row["ctl_rdev"] = None
        row["policy"] = os.sched_getscheduler(0)
        with open(f"{{SEEN}}.{{os.getpid()}}.{{os.getuid()}}", "a") as f:
            f.write(json.dumps(row) + "\\n")
        return row

    class ModelNew(nn.Module):
        def __init__(self, input_size, layer_sizes, output_size):
            super().__init__()
            row = {{}}
            {cuda_try}
            note(where="init", **row)
            layers, current = [], input_size
            for hidden in layer_sizes:
                layers += [nn.Linear(current, hidden), nn.ReLU()]
                current = hidden
            layers.append(nn.Linear(current, output_size))
            self.network = nn.Sequential(*layers)
            self.told = False

        def forward(self, x):
            if not self.told:
                self.told = True
                note(where="forward", cuda=torch.cuda.is_initialized())
            return self.network(x)
''')

# The cheapest attack: the driver itself, before the lock (as a kernel launched there would be).
CU_INIT = ('lib = ctypes.CDLL("libcuda.so.1"); row["cu_init"] = lib.cuInit(0); '
           'n = ctypes.c_int(); row["count_rc"] = lib.cuDeviceGetCount(ctypes.byref(n)); '
           'row["count"] = n.value')
# Unusual honest code: it asks whether CUDA is there (torch then keeps the answer, "no").
IS_AVAILABLE = 'row["available"] = torch.cuda.is_available()'


def _gpu_probe(tmp_path, drop_box, cuda_try):
    """GPU_PROBE with `cuda_try` in its constructor, judged built ahead: (the result, its rows
    from the constructor, its rows from the first forward)."""
    from eval_helpers import MLP_SMALL

    from evaluator.config import EvalConfig

    source = GPU_PROBE.format(seen=str(drop_box / "seen"), cuda_try=cuda_try)
    r = evaluate("L3/1", source, EvalConfig(device="cuda", cache_dir=tmp_path / "cache",
                                            baselines="eager", construct_at="before_lock",
                                            problem_overrides=MLP_SMALL,
                                            child_writable=[str(drop_box)]))
    rows = drop_rows(drop_box / "seen")
    return (r, [x for x in rows if x["where"] == "init"],
            [x for x in rows if x["where"] == "forward"])


@pytest.mark.gpu
def test_gpu_before_the_lock_the_driver_finds_no_device(tmp_path, drop_box):
    r, init, forward = _gpu_probe(tmp_path, drop_box, CU_INIT)
    null = os.stat(os.devnull).st_rdev
    first = init[0]
    print("rows:", init, forward, "flags:", r.flags)
    assert first["policy"] == os.SCHED_IDLE and first["ctl_rdev"] == null, first
    assert first["cu_init"] != 0 and (first["count_rc"] != 0 or first["count"] == 0), first
    # Under the lock, its device is its own again: the real node, a context, SCHED_OTHER.
    assert forward and all(x["ctl_rdev"] != null and x["cuda"] and
                           x["policy"] == os.SCHED_OTHER for x in forward), forward
    assert r.status == "correct", r.error


@pytest.mark.gpu
def test_gpu_a_constructor_that_asks_for_cuda_is_judged_under_the_lock(tmp_path, drop_box):
    r, init, _ = _gpu_probe(tmp_path, drop_box, IS_AVAILABLE)
    assert r.status == "correct", r.error
    # Before the lock (main and reparam models): "no"; built again under the lock: "yes".
    ahead = [x for x in init if x["policy"] == os.SCHED_IDLE]
    again = [x for x in init if x["policy"] == os.SCHED_OTHER]
    assert ahead and not any(x["available"] for x in ahead), init
    assert again and all(x["available"] for x in again), init
    assert any(f.startswith("constructed_under_lock: the device was unusable") for f in r.flags), \
        r.flags


@pytest.mark.gpu
def test_gpu_an_honest_candidate_is_built_ahead(tmp_path, drop_box):
    from eval_helpers import MLP_SMALL, candidate

    from evaluator.config import EvalConfig

    r = evaluate("L3/1", candidate("mlp_triton.py"),
                 EvalConfig(device="cuda", cache_dir=tmp_path / "cache", baselines="eager",
                            problem_overrides=MLP_SMALL))
    assert r.status == "correct", r.error
    assert not any(f.startswith("construct") for f in r.flags), r.flags


def test_links_planted_before_the_lock_do_not_redirect_the_harness(tmp_path, drop_box, secret):
    """The cheapest attack on the retry: before the lock, replace the files the harness writes
    again for the new child (the source, the job) with links to a file of the harness's, then
    fail. A root harness writing through them would overwrite that file; it writes them afresh
    instead, and the candidate is judged from the source the static rules read."""
    target = tmp_path / "harness_file"
    target.write_text("ORIGINAL")
    plant = textwrap.dedent(f'''\
        def attack():
            if os.sched_getscheduler(0) != os.SCHED_IDLE:
                return {{}}
            here = os.path.dirname(os.path.abspath(__file__))
            for name in ("candidate.py", "job_candidate.json", "job_forward.json"):
                path = os.path.join(here, name)
                try:
                    os.unlink(path)
                except OSError:
                    pass
                os.symlink({str(target)!r}, path)
            raise RuntimeError("planted")
    ''')
    r = evaluate("L3/1", _source(drop_box, secret, extra=plant),
                 _config(tmp_path, secret, "before_lock"))
    assert target.read_text() == "ORIGINAL"
    assert any(f.startswith("constructed_under_lock") and "planted" in f for f in r.flags), r.flags
    assert r.status == "correct", r.error


def test_a_child_the_device_cannot_be_given_to_is_judged_again(tmp_path, drop_box, secret,
                                                              monkeypatch):
    """The harness's side of the grant failing (here: SCHED_OTHER refused): the child built
    ahead never gets `go`; a new child, built under the lock, is judged instead."""
    monkeypatch.setattr(isolation, "foreground", lambda pid: "refused for the test")
    r = evaluate("L3/1", _source(drop_box, secret), _config(tmp_path, secret, "before_lock"))
    assert r.status == "correct", r.error
    assert "constructed_under_lock: the device could not be given to it: refused for the test" \
        in r.flags, r.flags
    forward = [x for x in drop_rows(drop_box / "seen") if x["where"] == "forward"]
    # Only the second child ran a forward, with the file in reach (nothing was uncovered twice).
    assert forward and all(x["text"] == "REAL" for x in forward), forward
