"""Children that run candidate code, where the harness is root, see no other evaluation: the
work parent holds only their own evaluation's dir, and their PID namespace holds only them. So one evaluation's candidate code cannot rewrite another's
files or stop its processes, even when both run under one identity (root without
capabilities, where no sandbox uid can reach the interpreter)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from eval_helpers import candidate, cpu_config, drop_rows, light_cuda_candidate

from kloop.evaluator.harness.pipeline import evaluate, evaluate_many
from kloop.evaluator.procs import isolation

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
    try:
        work = sorted(_o.listdir(parent))
    except PermissionError:  # a pool uid may not even list it (the tmpfs is root's, 0711)
        work = "EACCES"
    with open(f"{log}.{_o.getuid()}", "a") as f:  # under a uid pool, one file per uid
        f.write(_j.dumps({"child": _o.path.basename(_o.getcwd()), "pid": _o.getpid(),
                          "work": work, "others": others}) + "\\n")
'''


def test_candidate_code_sees_no_other_evaluation(tmp_path, drop_box):
    log = drop_box / "seen.jsonl"
    peek = f"import torch.nn as nn\n{LOOK}\n_look({str(log)!r})\n"
    # A CUDA candidate runs its module in the compile child (on CPU: an nvcc check), a
    # plain-PyTorch one in the candidate child; two honest evaluations run beside them.
    cuda = light_cuda_candidate().replace("import torch.nn as nn", peek, 1)
    torch_ = candidate("mlp_torch.py").replace("import torch.nn as nn", peek, 1)
    honest = candidate("mlp_torch.py")
    results = evaluate_many([("L3/1", cuda), ("L3/1", torch_), ("L3/1", honest),
                             ("L3/1", honest)], cpu_config(tmp_path / "cache"), max_workers=4)
    assert [r.status for r in results[1:]] == ["correct"] * 3, [r.error for r in results]
    rows = drop_rows(log)
    assert {r["child"] for r in rows} >= {"compile", "cand"}, rows
    for r in rows:
        assert r["work"] == "EACCES" or (
            len(r["work"]) == 1 and r["work"][0].startswith("kloop-eval-")), r
        assert r["pid"] == 1 and r["others"] == [], r


LITTER = '''
import errno as _e, json as _j, os as _o
def _litter(log, tag):
    seen = {}
    for d in ("/tmp", "/var/tmp", "/run/lock"):
        try:
            with open(_o.path.join(d, tag), "w") as f:
                f.write("left for the next candidate")
            seen[d] = "written"
        except OSError as e:
            seen[d] = _e.errorcode.get(e.errno, str(e.errno))
    shm, written = _o.path.join("/dev/shm", tag), 0
    try:
        with open(shm, "wb") as f:
            for _ in range(512):
                f.write(b"x" * (1 << 20))
                written += 1
        seen["/dev/shm"] = "written"
    except OSError as e:
        seen["/dev/shm"] = _e.errorcode.get(e.errno, str(e.errno))
    finally:
        if _o.path.exists(shm):
            _o.unlink(shm)
    seen["shm_mib"] = written
    with open(_o.path.join(_o.environ["TMPDIR"], "mine"), "w") as f:  # its own dir is writable
        f.write("x")
    with open(f"{log}.{_o.getuid()}.{_o.urandom(6).hex()}", "w") as f:  # every child is pid 1
        f.write(_j.dumps({"child": _o.path.basename(_o.getcwd()), **seen}))
'''


def test_candidate_code_cannot_fill_or_litter_shared_scratch(tmp_path, drop_box):
    """/tmp and /var/tmp are read-only to contained children (nothing is left there for a later
    candidate, no disk filled beside the evaluation's own dir), and /dev/shm is a 256 MiB tmpfs
    of their own; their own TMPDIR stays writable and the candidate passes."""
    import uuid

    log, tag = drop_box / "litter", f"kloop-litter-{uuid.uuid4().hex}"
    peek = f"import torch.nn as nn\n{LITTER}\n_litter({str(log)!r}, {tag!r})\n"
    cuda = light_cuda_candidate().replace("import torch.nn as nn", peek, 1)
    torch_ = candidate("mlp_torch.py").replace("import torch.nn as nn", peek, 1)
    results = evaluate_many([("L3/1", cuda), ("L3/1", torch_)], cpu_config(tmp_path / "cache"),
                            max_workers=2)
    assert results[1].status == "correct", results[1].error
    rows = drop_rows(log)
    assert {r["child"] for r in rows} >= {"compile", "cand"}, rows
    for r in rows:
        assert r["/tmp"] == "EROFS" and r["/var/tmp"] in ("EROFS", "ENOENT"), r
        assert r["/run/lock"] in ("EROFS", "ENOENT", "EACCES"), r
        assert r["/dev/shm"] == "ENOSPC" and 200 <= r["shm_mib"] <= 256, r
    assert not any(os.path.exists(os.path.join(d, tag)) for d in ("/tmp", "/var/tmp", "/run/lock"))


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
    rows = drop_rows(log)
    assert {r["child"] for r in rows} >= {"cand"}, rows
    for r in rows:
        assert r["work"] == "EACCES" or (
            len(r["work"]) == 1 and r["work"][0].startswith("kloop-eval-")), r
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


REWRITE = '''
import errno as _e, json as _j, os as _o
def _rewrite(log):
    me = _o.path.basename(_o.getcwd())
    seen = {"child": me}
    root = _o.path.dirname(_o.getcwd())
    for name, path in (("cand", _o.path.join(root, "cand", "candidate.py")),
                       ("ref", _o.path.join(root, "ref"))):
        try:
            if name == "cand" and me != "cand":
                with open(path, "a") as f:
                    f.write("\\nKLOOP_REWRITTEN = True\\n")
            else:
                _o.listdir(path)
            seen[name] = "ok"
        except OSError as x:
            seen[name] = _e.errorcode.get(x.errno, str(x.errno))
    with open(__file__) as f:  # the source this child imported
        seen["rewritten"] = "\\nKLOOP_REWRITTEN = True\\n" in f.read()
    with open(f"{log}.{_o.getpid()}.{me}", "w") as f:
        f.write(_j.dumps(seen) + "\\n")
'''


def test_the_compile_child_cannot_rewrite_the_candidate_childs_source(tmp_path, drop_box):
    """The compile child runs candidate code before the candidate child: its dir (the source the
    static rules judged, the trials' inputs) is covered for it, and the reference worker's dir
    for both, even where modes cannot keep them out (root without capabilities owns every dir
    here)."""
    log = drop_box / "rewrite"
    peek = f"import torch.nn as nn\n{REWRITE}\n_rewrite({str(log)!r})\n"
    cuda = light_cuda_candidate().replace("import torch.nn as nn", peek, 1)
    triton_ = candidate("mlp_triton.py").replace("import torch.nn as nn", peek, 1)
    results = evaluate_many([("L3/1", cuda), ("L3/1", triton_)],
                            cpu_config(tmp_path / "cache"), max_workers=2)
    assert results[1].status == "correct", results[1].error
    rows = drop_rows(log)
    assert {r["child"] for r in rows} >= {"compile", "cand"}, rows
    for r in rows:
        assert r["ref"] in ("EACCES", "ENOENT"), r
        assert not r["rewritten"], r
        if r["child"] != "cand":
            assert r["cand"] in ("EACCES", "ENOENT", "EROFS"), r


def test_root_without_capabilities_cannot_write_root_files_outside_its_evaluation(
        tmp_path, drop_box):
    """Root without capabilities still owns root's files (run records, kloop's caches): for it
    the whole tree is read-only but its own evaluation's dir and its cache."""
    import json
    import tempfile

    victim_dir = Path(tempfile.mkdtemp(prefix="kloop-victim-", dir=drop_box.parent))
    try:
        victim = victim_dir / "turns.jsonl"
        victim.write_text("")
        probe = ("import errno as _e, json as _j, os as _o\n"
                 "try:\n"
                 f"    open({str(victim)!r}, 'a').write('forged')\n"
                 "    _r = 'ok'\n"
                 "except OSError as _x:\n"
                 "    _r = _e.errorcode.get(_x.errno)\n"
                 f"open({str(drop_box / 'victim')!r} + '.' + str(_o.getpid()), 'w')"
                 ".write(_j.dumps({'victim': _r, 'uid': _o.getuid()}))\n")
        src = candidate("mlp_torch.py").replace("import torch.nn as nn",
                                                f"import torch.nn as nn\n{probe}", 1)
        r = evaluate("L3/1", src, cpu_config(tmp_path / "cache", sandbox_uid=None))
        assert r.status == "correct", r.error
        rows = [json.loads(f.read_text()) for f in drop_box.glob("victim.*")]
        assert rows and all(row == {"victim": "EROFS", "uid": 0} for row in rows), rows
        assert victim.read_text() == ""
    finally:
        import shutil

        shutil.rmtree(victim_dir, ignore_errors=True)


ESCAPE = '''
import ctypes as _c, errno as _e, json as _j, os as _o
def _escape(victim, mask, log):
    """From a user namespace of its own (in a forked child: a threaded process cannot enter
    one), try to lift the read-only tree and the masks."""
    r, w = _o.pipe()
    pid = _c.CDLL(None).fork()  # libc's: the static rules would reject os.fork (not the point)
    if pid == 0:
        out = {}
        try:
            libc = _c.CDLL(None, use_errno=True)
            uid, gid = _o.getuid(), _o.getgid()
            out["unshare"] = libc.unshare(0x10000000 | 0x00020000) == 0 or _c.get_errno()
            for name, text in (("setgroups", "deny"), ("uid_map", f"0 {uid} 1"),
                               ("gid_map", f"0 {gid} 1")):
                try:
                    with open(f"/proc/self/{name}", "w") as f:
                        f.write(text)
                except OSError as x:
                    out[name] = x.errno
            out["umount_mask"] = libc.umount2(mask.encode(), 2) == 0 or _c.get_errno()
            class A(_c.Structure):
                _fields_ = [(n, _c.c_uint64) for n in ("s", "c", "p", "u")]
            a = A(0, 1, 0, 0)
            out["rw_again"] = libc.syscall(442, -100, b"/", 0x8000, _c.byref(a),
                                           _c.sizeof(a)) == 0 or _c.get_errno()
            try:
                with open(victim, "a") as f:
                    f.write("forged")
                out["victim"] = "ok"
            except OSError as x:
                out["victim"] = _e.errorcode.get(x.errno)
            try:
                out["mask_listing"] = _o.listdir(mask)
            except OSError as x:
                out["mask_listing"] = _e.errorcode.get(x.errno)
        finally:
            _o.write(w, _j.dumps(out).encode())
            _o._exit(0)
    _o.close(w)
    _o.waitpid(pid, 0)
    data = _o.read(r, 65536).decode()
    with open(f"{log}.{_o.getpid()}", "w") as f:
        f.write(data)
'''


@pytest.mark.skipif(not isolation.can_change_uid(), reason="needs a root harness")
def test_a_user_namespace_of_its_own_does_not_lift_the_read_only_tree_or_the_masks(
        tmp_path, drop_box):
    """The cheapest attack on both: candidate code makes a user namespace of its own (no
    privilege needed), where it holds every capability over a copy of its mounts, and tries to
    unmount the mask over the reference worker's dir and to make the tree writable. The kernel
    locks mounts inherited from a more privileged namespace: both fail, the victim is intact."""
    import json
    import tempfile

    victim_dir = Path(tempfile.mkdtemp(prefix="kloop-victim-", dir=drop_box.parent))
    try:
        victim = victim_dir / "turns.jsonl"
        victim.write_text("")
        log = drop_box / "escape"
        # The mask over ref/: the child's cwd is <evaluation>/cand.
        call = (f"_escape({str(victim)!r}, _o.path.join(_o.path.dirname(_o.getcwd()), 'ref'), "
                f"{str(log)!r})\n")
        src = candidate("mlp_torch.py").replace("import torch.nn as nn",
                                                f"import torch.nn as nn\n{ESCAPE}\n{call}", 1)
        r = evaluate("L3/1", src, cpu_config(tmp_path / "cache", sandbox_uid=None))
        assert r.status == "correct", r.error
        rows = [json.loads(f.read_text()) for f in drop_box.glob("escape.*")]
        assert rows, "the probe never ran"
        for row in rows:
            assert row["victim"] == "EROFS", row
            assert row["umount_mask"] is not True and row["rw_again"] is not True, row
            assert row["mask_listing"] in ([], "EACCES"), row  # still the empty cover
            # The attack really ran: it got its namespace and every capability in it (with or
            # without a uid map: root may not map uid 0 without CAP_SETFCAP), so what stopped
            # it is the kernel's lock on inherited mounts (EINVAL, EPERM), not a missing right.
            assert row["unshare"] is True, row
        assert victim.read_text() == ""
    finally:
        import shutil

        shutil.rmtree(victim_dir, ignore_errors=True)
