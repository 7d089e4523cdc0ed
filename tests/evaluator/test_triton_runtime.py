"""Triton's runtime module (`cuda_utils`, built with gcc on a process's first Triton use) is
built once by trusted code into the harness-private cache and copied into each evaluation's
own Triton cache, so no candidate child compiles it under the device lock and no candidate can
change what another one loads."""

from __future__ import annotations

from pathlib import Path

import pytest
from eval_helpers import candidate, cpu_config

from kloop.evaluator.build import triton_runtime
from kloop.evaluator.harness.pipeline import evaluate
from kloop.evaluator.procs.isolation import private_dir


def _fake_build(monkeypatch, log: Path, fail: bool = False) -> None:
    """A stand-in for Triton's build (this host has no libcuda): it writes a module file where
    Triton's cache manager would, and logs each run."""
    snippet = (
        "import os, pathlib\n"
        f"open({str(log)!r}, 'a').write('built\\n')\n"
        + ("raise SystemExit(3)\n" if fail else
           "d = pathlib.Path(os.environ['TRITON_CACHE_DIR']) / 'KEY'\n"
           "d.mkdir(parents=True)\n"
           "(d / 'cuda_utils.so').write_bytes(b'module')\n")
    )
    monkeypatch.setattr(triton_runtime, "_BUILD", snippet)
    monkeypatch.setattr(triton_runtime, "_failed", set())


def test_one_trusted_build_seeds_every_evaluation_with_its_own_copy(tmp_path, monkeypatch):
    log = tmp_path / "builds.log"
    _fake_build(monkeypatch, log)
    cache = tmp_path / "cache"
    first, second = tmp_path / "eval1" / "triton", tmp_path / "eval2" / "triton"
    assert triton_runtime.seed(cache, first) == 1
    assert triton_runtime.seed(cache, second) == 1
    assert log.read_text() == "built\n"  # built once, for both
    built = triton_runtime.runtime_dir(cache)
    assert private_dir(cache) in built.parents  # masked from every child
    # A candidate that rewrites its evaluation's copy changes nothing anyone else loads.
    (first / "KEY" / "cuda_utils.so").write_bytes(b"payload")
    assert (built / "KEY" / "cuda_utils.so").read_bytes() == b"module"
    assert (second / "KEY" / "cuda_utils.so").read_bytes() == b"module"
    third = tmp_path / "eval3" / "triton"
    triton_runtime.seed(cache, third)
    assert (third / "KEY" / "cuda_utils.so").read_bytes() == b"module"


def test_a_failed_build_seeds_nothing_and_is_not_retried(tmp_path, monkeypatch):
    log = tmp_path / "builds.log"
    _fake_build(monkeypatch, log, fail=True)
    cache = tmp_path / "cache"
    assert triton_runtime.seed(cache, tmp_path / "eval1" / "triton") == 0
    assert triton_runtime.seed(cache, tmp_path / "eval2" / "triton") == 0
    assert log.read_text() == "built\n"
    assert not triton_runtime.runtime_dir(cache).exists()
    assert not (tmp_path / "eval1" / "triton").exists()


@pytest.mark.gpu
def test_the_candidate_child_loads_the_prebuilt_runtime(tmp_path):
    """On the GPU: the evaluation's Triton cache holds exactly the prebuilt module after a
    Triton candidate ran (the child found it under the key Triton computes, and built none)."""
    from kloop.evaluator.harness import stages

    cache = tmp_path / "cache"
    # The evaluation's own root, as the candidate stage sees it (a work root of the test's own,
    # under pytest's private tmp dir, is closed to the sandbox uid the candidate runs as).
    roots: list[Path] = []
    ahead = stages.construct_ahead
    mp = pytest.MonkeyPatch()
    mp.setattr(stages, "construct_ahead",
               lambda run, ledger: roots.append(run.root) or ahead(run, ledger))
    try:
        r = evaluate("L3/1", candidate("mlp_triton.py"),
                     cpu_config(cache, device="cuda", keep_workdir=True))
    finally:
        mp.undo()
    assert r.status == "correct", r.error
    root = roots[0] / "triton"
    built = triton_runtime.built_runtime(cache)
    assert built is not None
    prebuilt = {p.relative_to(built): p.read_bytes() for p in built.rglob("cuda_utils*")}
    assert prebuilt
    found = {p.relative_to(root): p.read_bytes() for p in root.rglob("cuda_utils*")}
    assert found == prebuilt
