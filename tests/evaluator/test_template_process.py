"""Children forked from the template process (`evaluator.procs.forkserver`, `evaluator.worker.zygote`)
are the children a fresh interpreter would have been: their own session, fds, environment and
working directory, nothing of the template's, re-parented to the harness; and when the template
is gone, children start the plain way."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import pytest
from eval_helpers import MLP_SMALL, candidate, cpu_config, light_cuda_candidate

from kloop.evaluator.harness.pipeline import evaluate
from kloop.evaluator.procs import forkserver

pytestmark = pytest.mark.skipif(not forkserver.usable(), reason="needs Linux and a subreaper")

PROBE = '''
import json, os, sys
_DYNAMO_AT_IMPORT = "torch._dynamo" in sys.modules
_CUDA_AT_IMPORT = __import__("torch").cuda.is_initialized()
def _facts(path):
    fds = {}
    for name in os.listdir("/proc/self/fd"):
        try:
            fds[name] = os.readlink(f"/proc/self/fd/{name}")
        except OSError:
            pass
    facts = dict(pid=os.getpid(), ppid=os.getppid(), sid=os.getsid(0), cwd=os.getcwd(),
                 path0=sys.path[0], env=sorted(os.environ), home=os.environ.get("HOME"),
                 fds=fds, dynamo=_DYNAMO_AT_IMPORT, cuda=_CUDA_AT_IMPORT,
                 cuda_now=__import__("torch").cuda.is_initialized(), template=getattr(getattr(sys.modules["__main__"], "__spec__", None),
                                           "name", None) == "kloop.evaluator.worker.zygote")
    with open(path, "w") as f:
        json.dump(facts, f)
'''


def _probe_source(out: Path) -> str:
    src = candidate("mlp_torch.py")
    src = src.replace("class ModelNew(", PROBE + "\nclass ModelNew(", 1)
    return src.replace("    def forward(self, x):",
                       f"    def forward(self, x):\n        _facts({str(out)!r})", 1)


def test_a_forked_child_has_only_its_own_session_fds_environment_and_directory(
        tmp_path, drop_box, monkeypatch):
    monkeypatch.setenv("KLOOP_TEST_SECRET_TOKEN", "must-not-reach-a-child")
    out = drop_box / "facts.json"
    r = evaluate("L3/1", _probe_source(out), cpu_config(tmp_path / "cache", policy="kernelbench"))
    assert r.status == "correct", r.error
    facts = json.loads(out.read_text())
    assert facts["template"], "the child was not forked from the template"
    # Imported once in the template: the profiler's first session (and torch.compile) would
    # otherwise import it in every child, seconds under the exclusive device lock.
    assert facts["dynamo"]
    if os.geteuid() == 0:  # contained: the first process of a PID namespace of its own
        assert (facts["pid"], facts["ppid"]) == (1, 0)
    else:
        assert facts["ppid"] == os.getpid()  # re-parented to the harness, which waits for it
    assert facts["sid"] == facts["pid"]  # a session (and process group) of its own
    assert facts["path0"] == facts["cwd"] and facts["home"].startswith(facts["cwd"])
    assert "KLOOP_TEST_SECRET_TOKEN" not in facts["env"]
    links = set(facts["fds"].values())
    assert not any(link.startswith("socket:") for link in links), links  # not the template's
    assert not any(str(tmp_path / "cache") in link for link in links if "cand" not in link), links


def test_without_the_template_children_start_the_plain_way(tmp_path, drop_box, monkeypatch):
    fresh = {k: forkserver.ForkServer(interpret=k) for k in (False, True)}
    monkeypatch.setattr(forkserver, "_SERVERS", fresh)
    cfg = cpu_config(tmp_path / "cache", problem_overrides=MLP_SMALL)
    assert evaluate("L3/1", candidate("mlp_torch.py"), cfg).status == "correct"
    for server in fresh.values():  # the reference's (native Triton), the candidate's (interpreted)
        assert server._proc is not None and server._proc.poll() is None
        os.kill(server._proc.pid, signal.SIGKILL)  # the template dies
        server._proc.wait()
    out = drop_box / "facts.json"
    r = evaluate("L3/1", _probe_source(out), cpu_config(tmp_path / "cache", policy="kernelbench"))
    assert r.status == "correct", r.error
    facts = json.loads(out.read_text())
    assert not facts["template"] and fresh[True]._broken
    # Started the plain way, a child that should have been contained is not: the result says so.
    from kloop.evaluator.procs import isolation

    assert ("isolation_uncontained" in r.flags) == isolation.work_parent(None)[1], r.flags


@pytest.mark.gpu
def test_a_forked_child_initialises_the_gpu_and_is_timed(tmp_path, drop_box):
    """On a GPU: the template never touched the device, so its forks can; the probe says the
    child was a fork, its forward ran with a CUDA context, and the evaluation is correct and
    timed by the harness. (Its import may see no context: the candidate is built ahead where no
    device can be reached, `test_build_ahead`.)"""
    out = drop_box / "facts.json"
    r = evaluate("L3/1", _probe_source(out), cpu_config(
        tmp_path / "cache", policy="kernelbench", device="cuda", problem_overrides=MLP_SMALL))
    assert r.status == "correct" and r.timing is not None, r.error
    facts = json.loads(out.read_text())
    assert facts["template"] and facts["cuda_now"], facts  # the forward ran on the device


_READY_THEN_LOOK = """
import torch
from kloop.evaluator.worker.child import Channel, wait_for_device
went = wait_for_device(Channel(-1))
print(went, torch.cuda.is_initialized())
"""


@pytest.mark.gpu
def test_nothing_of_cuda_is_touched_before_go():
    """A child makes its CUDA context under the device lock, at its first use of the device:
    none exists when it says ready and is told to go (one made beside a timing widens its
    tail)."""
    import subprocess
    import sys

    p = subprocess.run([sys.executable, "-c", _READY_THEN_LOOK],
                       input='{"next": "go"}\n', capture_output=True, text=True, timeout=120,
                       cwd=Path(__file__).resolve().parents[2])
    assert p.returncode == 0, p.stderr[-2000:]
    assert p.stdout.split() == ["True", "False"], p.stdout


@pytest.mark.skipif(os.geteuid() != 0, reason="hiding paths needs a root harness")
def test_a_compile_child_cannot_open_what_is_hidden_from_builds(tmp_path, drop_box):
    """The compile child runs candidate code outside the device lock; the GPU's device nodes
    (here a stand-in file, through `hidden_from_builds`) are /dev/null in its mount namespace,
    so it cannot load the GPU while another evaluation is being timed."""
    secret = drop_box / "nvidia-standin"
    secret.write_text("the device")
    secret.chmod(0o666)  # readable by any uid: only the mount namespace may stop the child
    out = drop_box / "seen.txt"
    src = light_cuda_candidate()  # a CUDA candidate: it has a compile stage
    peek = f"open({str(out)!r}, 'w').write(open({str(secret)!r}).read() + '\\n')"
    src = src.replace("import torch.nn as nn", f"import torch.nn as nn\n{peek}", 1)
    evaluate("L3/1", src, cpu_config(tmp_path / "cache", policy="kernelbench",
                                     hidden_from_builds=[str(secret)]))
    seen = out.read_text().splitlines()
    assert seen and all(line == "" for line in seen), seen  # /dev/null, every time it ran
    assert secret.read_text() == "the device"  # and nothing changed outside the child


@pytest.mark.gpu
def test_a_compile_child_cannot_reach_the_gpu_even_when_it_asks_for_it(tmp_path, drop_box):
    """On a GPU: candidate code in the compile child sets CUDA_VISIBLE_DEVICES back before CUDA
    starts; the device nodes are /dev/null there, so it still sees no GPU (the candidate child,
    under the device lock, does)."""
    out = drop_box / "seen.txt"
    peek = ("import os as _os\n"
            "if _os.path.basename(_os.getcwd()) == 'compile':\n"
            "    _os.environ['CUDA_VISIBLE_DEVICES'] = '0'\n"
            "    import torch as _t\n"
            f"    open({str(out)!r}, 'w').write(str(_t.cuda.is_available()))\n")
    src = candidate("mlp_cuda_relu.py").replace("import torch.nn as nn",
                                                f"import torch.nn as nn\n{peek}", 1)
    r = evaluate("L3/1", src, cpu_config(tmp_path / "cache", policy="kernelbench", device="cuda",
                                         problem_overrides=MLP_SMALL))
    assert out.read_text() == "False", r.status
