"""The JIT warm-up pass (`stages.warmup_pass`, `EvalConfig.jit_warmup`): candidate code that
runs before the candidate child, under the shared device lock. It is candidate code like any
other (sandboxed, contained), and nothing it does decides anything: a warm-up that hangs,
crashes or behaves differently changes no verdict."""

from __future__ import annotations

from pathlib import Path

import pytest
from eval_helpers import candidate, cpu_config

from kloop.evaluator.common.config import StageTimeouts
from kloop.evaluator.harness import stages
from kloop.evaluator.harness.pipeline import evaluate
from kloop.evaluator.procs import isolation

# Knows it is the warm-up (its work dir's name) and misbehaves only there.
IN_WARMUP = 'import os as _o\n_WARM = _o.path.basename(_o.getcwd()) == "warm"\n'


def _in_warmup(body: str, base: str = "mlp_torch.py") -> str:
    src = candidate(base)
    return src.replace("import torch.nn as nn", f"import torch.nn as nn\n{IN_WARMUP}{body}", 1)


def _short(tmp_path: Path, **kw):
    t = StageTimeouts(startup=180, load=8, correctness=8, timing=120, profile=120, compile=300,
                      reference=180, baselines=300)
    return cpu_config(tmp_path / "cache", jit_warmup="on", timeouts=t, **kw)


def test_a_warmup_that_hangs_is_killed_and_the_candidate_is_still_judged(tmp_path):
    r = evaluate("L3/1", _in_warmup("if _WARM:\n    while True: pass\n"), _short(tmp_path))
    assert r.status == "correct", r.error
    assert r.stage_seconds["warmup"] >= 7, r.stage_seconds


def test_a_warmup_that_crashes_or_cheats_decides_nothing(tmp_path):
    crash = _in_warmup("if _WARM:\n    _o.abort()\n")
    assert evaluate("L3/1", crash, _short(tmp_path)).status == "correct"
    # Wrong only outside the warm-up: the candidate child's trials still catch it.
    wrong = _in_warmup("").replace("return F.linear(x, linears[-1].weight, linears[-1].bias)",
                                   "return F.linear(x, linears[-1].weight, linears[-1].bias)"
                                   " * (1.0 if _WARM else 1.5)")
    assert "_WARM else 1.5" in wrong
    assert evaluate("L3/1", wrong, _short(tmp_path)).status == "incorrect"


@pytest.mark.skipif(not isolation.can_change_uid(), reason="needs a root harness")
def test_the_warmup_child_is_contained_like_the_candidate_child(tmp_path, drop_box):
    log = drop_box / "seen"
    body = ("import json as _j\n"
            f"with open({str(log)!r} + '.' + _o.path.basename(_o.getcwd()), 'a') as _f:\n"
            "    _f.write(_j.dumps({'pid': _o.getpid(), 'uid': _o.getuid(),\n"
            "                       'tmp_writable': _o.access('/tmp', _o.W_OK),\n"
            "                       'cand_writable': _o.access(_o.path.join(\n"
            "                           _o.path.dirname(_o.getcwd()), 'cand'), _o.W_OK)}) + '\\n')\n")
    r = evaluate("L3/1", _in_warmup(body), _short(tmp_path))
    assert r.status == "correct", r.error
    import json

    rows = {f.name.rsplit(".", 1)[1]: json.loads(f.read_text().splitlines()[0])
            for f in drop_box.glob("seen.*")}
    assert set(rows) >= {"warm", "cand"}, rows
    same = ("pid", "uid", "tmp_writable")
    assert [rows["warm"][k] for k in same] == [rows["cand"][k] for k in same], rows
    assert rows["warm"]["pid"] == 1 and not rows["warm"]["tmp_writable"], rows
    # Under a uid of its own (not root without capabilities, the owner of every dir here) the
    # warm-up cannot write the candidate child's dir: not its source, not the trials' inputs.
    assert rows["warm"]["uid"] == 0 or not rows["warm"]["cand_writable"], rows


def test_auto_warms_up_jit_sources_on_a_gpu_only():
    from types import SimpleNamespace

    def wants(mode: str, on_cpu: bool, name: str) -> bool:
        run = SimpleNamespace(config=SimpleNamespace(jit_warmup=mode), on_cpu=on_cpu,
                              source=candidate(name))
        return stages.wants_warmup(run)  # type: ignore[arg-type]

    assert wants("auto", False, "mlp_triton.py") and not wants("auto", True, "mlp_triton.py")
    assert not wants("auto", False, "mlp_torch.py")  # nothing to compile: no extra process
    assert wants("on", True, "mlp_torch.py") and not wants("off", False, "mlp_triton.py")


@pytest.mark.gpu
def test_the_candidate_child_finds_every_triton_kernel_the_warmup_compiled(tmp_path,
                                                                           monkeypatch):
    """On the GPU: the warm-up child's Triton compiles are all the candidate child needs (it
    adds nothing to the evaluation's Triton cache), so no JIT runs under the exclusive lock."""
    seen: dict[str, set[str]] = {}
    warm = stages.warmup_pass

    def observed(run, job):
        warm(run, job)
        seen["after_warmup"] = {p.name for p in (run.root / "triton").iterdir()}
        seen["root"] = run.root

    monkeypatch.setattr(stages, "warmup_pass", observed)
    cfg = cpu_config(tmp_path / "cache", device="cuda", jit_warmup="auto", keep_workdir=True)
    r = evaluate("L3/1", candidate("mlp_triton.py"), cfg)
    assert r.status == "correct", r.error
    assert seen["after_warmup"], "the warm-up compiled nothing"
    assert {p.name for p in (seen["root"] / "triton").iterdir()} == seen["after_warmup"]
    assert "warmup" in r.stage_seconds
