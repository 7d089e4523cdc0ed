"""The build ahead's mechanism (`EvalConfig.construct_at`): a candidate child built ahead imports
the candidate and builds its models before the device lock, kept from the device (its nodes
covered by /dev/null in its mount namespace) and at SCHED_IDLE, and gets both back only once the
harness holds the lock. Here: which harness builds ahead at all (a root harness lacking a
capability it needs does not), and what a retry's flag names as its cause.

Candidate code against it (the attacks before the lock, the unusual honest constructors, a child
the device cannot be given to, links planted for the retry, and the GPU's own nodes) is
tests/exploits/test_build_ahead.py.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from kloop.evaluator.procs import forkserver, isolation

pytestmark = pytest.mark.skipif(
    not (forkserver.usable() and isolation.can_grant()),
    reason="needs a root harness with the capabilities to give the device back, and the "
           "template process")


@pytest.mark.skipif(shutil.which("setpriv") is None, reason="needs util-linux's setpriv")
@pytest.mark.parametrize("cap", ["sys_nice", "sys_admin", "sys_ptrace", "sys_chroot"])
def test_a_root_harness_without_a_capability_it_needs_builds_under_the_lock(cap, tmp_path):
    """Root in a container often lacks some (Docker's default set has none of these four): such
    a harness never builds ahead, where it could neither uncover the device nor restore the
    child's priority (every candidate would be built twice)."""
    code = ("from kloop.evaluator.procs import isolation; "
            "from kloop.evaluator.harness.stages import construct_ahead; "
            "from kloop.evaluator.harness.state import EvalRun; "
            "from kloop.problems.registry import get_problem; "
            "import sys; sys.path.insert(0, 'tests/evaluator'); "
            "from eval_helpers import cpu_config; from pathlib import Path; "
            f"run = EvalRun.create(get_problem('L3/1'), '', cpu_config(Path({str(tmp_path)!r}))); "
            "from kloop.evaluator.harness.ledger import Ledger; ledger = Ledger(run.root); "
            "print(isolation.can_grant(), construct_ahead(run, ledger), ledger.verdict.flags); "
            "run.cleanup()")
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

    from kloop.evaluator.worker.ahead import CudaQueries

    before = torch.cuda.is_available
    CudaQueries.first = None
    with CudaQueries.watched():
        torch.cuda.device_count()  # this line is the one named
        line = __import__("inspect").currentframe().f_lineno - 1
        torch.cuda.is_available()
    assert CudaQueries.first == f"torch.cuda.device_count() at {__file__}:{line}"
    assert torch.cuda.is_available is before


def test_a_child_not_kept_from_the_device_builds_under_the_lock_and_says_so(tmp_path):
    """The child's trusted start checks what it was kept from before any candidate code runs.
    A path the host could not cover (here a directory, which /dev/null cannot be bound over)
    means it waits for the lock to build, as without `construct_at`: judged the same, and the
    result says the lock paid for the build."""
    sys.path.insert(0, str(Path(__file__).parent))
    from eval_helpers import cpu_config

    from kloop.evaluator.harness.pipeline import evaluate
    from kloop.evaluator.procs.sandbox import KLOOP_ROOT
    from kloop.problems.registry import get_problem, reference_as_candidate

    # Beside kloop's own files, which every child sees: under /tmp (tmp_path) the host view
    # hides the whole directory, and a path the child cannot see at all it is kept from.
    uncoverable = Path(tempfile.mkdtemp(prefix=".uncoverable-", dir=KLOOP_ROOT))
    source = reference_as_candidate(get_problem("L3/1").path.read_text())
    config = cpu_config(tmp_path / "cache", construct_at="before_lock",
                        hidden_from_builds=[str(uncoverable)])
    try:
        r = evaluate("L3/1", source, config)
    finally:
        uncoverable.rmdir()
    assert r.status == "correct", r.error
    assert [f for f in r.flags if f.startswith("construct_before_lock_unavailable")] == [
        "construct_before_lock_unavailable: the child was not kept from the device, so it "
        "built under the lock"], r.flags
    assert not any(f.startswith("constructed_under_lock") for f in r.flags), r.flags
    # The same candidate with nothing it cannot be kept from builds ahead, unflagged.
    ok = evaluate("L3/1", source, cpu_config(tmp_path / "cache", construct_at="before_lock"))
    assert ok.status == "correct" and not any("construct" in f for f in ok.flags), ok.flags
