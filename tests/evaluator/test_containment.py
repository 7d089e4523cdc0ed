"""Children that run candidate code, where the harness is root, see no other evaluation: the
work parent holds only their own evaluation's dir, and their PID namespace holds only them. So one evaluation's candidate code cannot rewrite another's
files or stop its processes, even when both run under one identity (root without
capabilities, where no sandbox uid can reach the interpreter)."""

from __future__ import annotations

import json
import os

import pytest
from eval_helpers import candidate, cpu_config

from evaluator import isolation
from evaluator.pipeline import evaluate_many

pytestmark = pytest.mark.skipif(not isolation.can_change_uid(), reason="needs a root harness")

LOOK = '''
import json as _j, os as _o
def _look(log):
    parent = _o.path.dirname(_o.path.dirname(_o.getcwd()))
    others = []
    for name in _o.listdir("/proc"):
        if name.isdigit() and int(name) != _o.getpid():
            try:
                cmd = open(f"/proc/{name}/cmdline", "rb").read().replace(b"\\0", b" ").decode()
            except OSError:
                continue
            if "evaluator" in cmd or "pytest" in cmd:
                others.append(cmd[:80])
    with open(f"{log}.{_o.getuid()}", "a") as f:  # under a uid pool, one file per uid
        f.write(_j.dumps({"child": _o.path.basename(_o.getcwd()), "pid": _o.getpid(),
                          "work": sorted(_o.listdir(parent)), "others": others}) + "\\n")
'''


def _rows(log):
    return [json.loads(line) for f in log.parent.glob(f"{log.name}.*")
            for line in f.read_text().splitlines()]


def test_candidate_code_sees_no_other_evaluation(tmp_path, drop_box):
    log = drop_box / "seen.jsonl"
    peek = f"import torch.nn as nn\n{LOOK}\n_look({str(log)!r})\n"
    # A CUDA candidate runs its module in the compile child (on CPU: an nvcc check), a
    # plain-PyTorch one in the candidate child; two honest evaluations run beside them.
    cuda = candidate("mlp_cuda_relu.py").replace("import torch.nn as nn", peek, 1)
    torch_ = candidate("mlp_torch.py").replace("import torch.nn as nn", peek, 1)
    honest = candidate("mlp_torch.py")
    results = evaluate_many([("L3/1", cuda), ("L3/1", torch_), ("L3/1", honest),
                             ("L3/1", honest)], cpu_config(tmp_path / "cache"), max_workers=4)
    assert [r.status for r in results[1:]] == ["correct"] * 3, [r.error for r in results]
    rows = _rows(log)
    assert {r["child"] for r in rows} >= {"compile", "cand"}, rows
    for r in rows:
        assert len(r["work"]) == 1 and r["work"][0].startswith("kloop-eval-"), r
        assert r["pid"] == 1 and r["others"] == [], r


@pytest.mark.gpu
def test_gpu_candidate_code_sees_no_other_evaluation(tmp_path, drop_box):
    """The same on the GPU: candidate children that run CUDA and Triton kernels are contained
    too (their own PID namespace, only their own evaluation's dir), and still pass."""
    log = drop_box / "seen.jsonl"
    peek = f"import torch.nn as nn\n{LOOK}\n_look({str(log)!r})\n"
    triton_ = candidate("mlp_triton.py").replace("import torch.nn as nn", peek, 1)
    torch_ = candidate("mlp_torch.py").replace("import torch.nn as nn", peek, 1)
    honest = candidate("mlp_torch.py")
    results = evaluate_many([("L3/1", triton_), ("L3/1", torch_), ("L3/1", honest)],
                            cpu_config(tmp_path / "cache", device="cuda"), max_workers=3)
    assert [r.status for r in results] == ["correct"] * 3, [r.error for r in results]
    rows = _rows(log)
    assert {r["child"] for r in rows} >= {"cand"}, rows
    for r in rows:
        assert len(r["work"]) == 1 and r["work"][0].startswith("kloop-eval-"), r
        assert r["pid"] == 1 and r["others"] == [], r


def test_a_work_parent_someone_else_made_is_not_used(tmp_path):
    """A candidate (another uid) that made `kloop-work` first would own every evaluation's
    parent; the harness makes one of its own instead."""
    squat = tmp_path / isolation.WORK_DIR
    squat.mkdir(mode=0o777)
    os.chown(squat, 12345, 12345)
    path, contained = isolation.work_parent(tmp_path)
    assert path != squat and path.parent == tmp_path and path.stat().st_uid == 0
    assert contained and os.stat(path).st_mode & 0o777 == 0o711
    fine, _ = isolation.work_parent(tmp_path / "clean")
    assert fine == tmp_path / "clean" / isolation.WORK_DIR
