"""The JIT prime (`jit_prime`): the candidate's Triton kernels compiled for the GPU before the
device lock, in a child that has no GPU, and nothing it does decides anything."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from eval_helpers import candidate, cpu_config

from kloop.agent.demo.kernels import SIZES, source
from kloop.evaluator.harness.pipeline import evaluate

L3_1 = SIZES["L3/1"]


def _run(tmp_path: Path, src: str, **extra):
    work = tmp_path / "work"
    r = evaluate("L3/1", src, cpu_config(tmp_path / "cache", jit_prime="on", keep_workdir=True,
                                         work_root=work, problem_overrides=L3_1, **extra))
    (root,) = list(work.rglob("kloop-eval-*"))
    return r, root


def test_the_prime_compiles_the_candidates_kernels_for_the_gpu_without_one(tmp_path):
    """On this CPU host: the kernel is compiled for sm_90 into the evaluation's own Triton
    cache (what the candidate child on the GPU would compile at its first launch), the
    candidate is judged as without the prime."""
    r, root = _run(tmp_path, source("L3/1", "ok"))
    assert r.status == "correct", r.error
    assert "prime" in r.stage_seconds
    cubins = [p.name for p in (root / "triton").rglob("*.cubin")]
    assert cubins == ["relu_kernel.cubin"], cubins


def test_a_candidate_that_needs_data_stops_the_prime_and_is_judged_as_always(tmp_path):
    src = source("L3/1", "ok").replace(
        "    x = x.contiguous()\n", "    x = x.contiguous()\n    assert float(x.abs().sum()) >= 0\n", 1)
    r, root = _run(tmp_path, src)
    assert r.status == "correct", r.error
    assert "prime" in r.stage_seconds
    assert not list((root / "triton").rglob("*.cubin"))  # it stopped before the launch


def test_a_wrong_candidate_is_still_wrong_and_a_crashing_one_still_crashes(tmp_path):
    assert _run(tmp_path / "a", source("L3/1", "wrong"))[0].status == "incorrect"
    assert _run(tmp_path / "b", source("L3/1", "crash"))[0].status == "runtime_error"


@pytest.mark.skipif(os.geteuid() != 0, reason="hiding paths needs a root harness")
def test_the_prime_child_cannot_open_what_is_hidden_from_builds(tmp_path, drop_box):
    """Candidate code runs in the prime outside the device lock: the GPU's device nodes (here
    a stand-in file) are /dev/null for it, as for the compile child; the candidate child,
    which runs under the lock, reads the file."""
    secret = drop_box / "nvidia-standin"
    secret.write_text("the device")
    secret.chmod(0o666)
    out = drop_box / "seen.txt"
    peek = ("import os as _os\n"
            f"open({str(out)!r}, 'a').write(_os.path.basename(_os.getcwd()) + ':' + "
            f"open({str(secret)!r}).read() + '\\n')\n")
    src = source("L3/1", "ok").replace("import triton\n", f"import triton\n{peek}", 1)
    r, _ = _run(tmp_path, src, hidden_from_builds=[str(secret)])
    assert r.status == "correct", r.error
    seen = dict(line.split(":", 1) for line in out.read_text().splitlines())
    assert seen.get("prime") == "", seen
    assert secret.read_text() == "the device"


@pytest.mark.gpu
def test_the_candidate_child_finds_every_kernel_the_prime_compiled(tmp_path):
    """On the GPU: after the prime, the candidate child adds nothing to the evaluation's Triton
    cache: it found every kernel under the keys it computed, and (Triton 3.6, whose launcher is
    a gcc-built module per signature) the launcher modules the prime built, so neither JIT nor
    gcc ran under the lock. On the H200 before the prime built launchers, the child added
    exactly one entry, the launcher module."""
    from kloop.evaluator.harness import stages

    seen: dict[str, set[str]] = {}
    prime = stages.prime_pass

    def observed(run, job):
        prime(run, job)
        seen["after"] = {p.name for p in (run.root / "triton").iterdir()}
        seen["root"] = run.root

    mp = pytest.MonkeyPatch()
    mp.setattr(stages, "prime_pass", observed)
    try:
        r = evaluate("L3/1", candidate("mlp_triton.py"),
                     cpu_config(tmp_path / "cache", device="cuda", jit_prime="auto",
                                keep_workdir=True))
    finally:
        mp.undo()
    assert r.status == "correct", r.error
    assert any((seen["root"] / "triton" / d).glob("*.cubin") for d in seen["after"])
    added = {p.name for p in (seen["root"] / "triton").iterdir()} - seen["after"]
    compiled = {d for d in added if any((seen["root"] / "triton" / d).glob("*.cubin"))}
    assert not compiled, f"the candidate child compiled kernels the prime had not: {compiled}"
    assert not added, {d: [f.name for f in (seen["root"] / "triton" / d).iterdir()] for d in added}


def test_the_prime_runs_no_candidate_code_where_a_gpu_node_is_still_a_device():
    """Hiding the GPU's nodes needs privilege or user namespaces; where it failed, a node is
    still a device (not /dev/null's 1:3) and the prime stops before importing the candidate."""
    from kloop.evaluator.worker.prime import gpu_reachable

    assert not gpu_reachable("/dev/null")  # what a hidden node looks like
    assert not gpu_reachable("/nonexistent/nvidia*")
    if os.path.exists("/dev/tty"):
        assert gpu_reachable("/dev/tty")  # a character device that is not 1:x


@pytest.mark.parametrize("arch_list, expected", [
    ("9.0", 90), ("9.0a", 90), ("9.0+PTX", 90), ("8.6 9.0a", 86), ("10.0a;12.0", 100)])
def test_the_prime_targets_the_architecture_whatever_its_suffix(arch_list, expected):
    """The H200's environment says `9.0a`: the prime must compile for 90 (Triton's own name for
    sm_90a), not stop at `int("90a")` (it did, and compiled nothing on the GPU)."""
    from kloop.evaluator.harness.stages import triton_arch

    assert triton_arch(arch_list) == expected


def test_an_architecture_that_is_not_one_is_refused():
    from kloop.evaluator.harness.stages import triton_arch

    with pytest.raises(ValueError, match="not a CUDA architecture"):
        triton_arch("sm_90")
