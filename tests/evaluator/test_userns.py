"""A harness that is not root contains its children through an unprivileged user namespace
(`isolation.userns_works`, `zygote._enter_userns`): the same mount, PID, network and IPC
namespaces as under a root harness, plus a read-only file tree, since the child still acts as
the harness's uid on every file (it must not rewrite the user's run records or kloop's caches).
Run here by starting the harness itself under an unprivileged uid (skipped where that uid
cannot reach this interpreter or repo, or the host forbids user namespaces)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
UID = 65534

PROBE = '''
import errno as _e, json as _j, os as _o
def _probe(victim, private):
    def _try(fn):
        try:
            fn()
            return "ok"
        except OSError as x:
            return _e.errorcode.get(x.errno, str(x.errno))
    def _append():
        with open(victim, "a") as f:
            f.write("forged\\n")
    parent = _o.path.dirname(_o.path.dirname(_o.getcwd()))
    row = {"child": _o.path.basename(_o.getcwd()), "pid": _o.getpid(),
           "work": sorted(_o.listdir(parent)), "victim": _try(_append),
           "private": _try(lambda: _o.listdir(private) and None or open(
               _o.path.join(private, "x"), "w").close()),
           "own": _try(lambda: open("own-file", "w").close())}
    with open("seen.jsonl", "a") as f:  # its own dir: the one place it may write
        f.write(_j.dumps(row) + "\\n")
'''

HARNESS = textwrap.dedent('''
    import json, sys
    from pathlib import Path
    sys.path[:0] = [sys.argv[1], sys.argv[1] + "/tests/evaluator"]
    from eval_helpers import candidate, cpu_config
    from kloop.evaluator.procs import isolation
    from kloop.evaluator.harness.pipeline import evaluate
    base, src = Path(sys.argv[2]), Path(sys.argv[3]).read_text()
    extra = {"sandbox_uid": None} if len(sys.argv) > 4 else {}
    r = evaluate("L3/1", src, cpu_config(base / "cache", work_root=base / "work",
                                         keep_workdir=True, **extra))
    print(json.dumps({"status": r.status, "flags": r.flags, "userns": isolation.userns_works(),
                      "error": r.error.message if r.error else None}))
''')


def _as_uid(*argv: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(["setpriv", f"--reuid={UID}", f"--regid={UID}", "--clear-groups",
                           *argv], capture_output=True, text=True, cwd=cwd, timeout=600)


@pytest.fixture
def base(tmp_path_factory):
    if os.geteuid() != 0:
        pytest.skip("starts a harness under another uid: needs root")
    top = Path("/var/tmp") if Path("/var/tmp").is_dir() else Path("/tmp")
    import tempfile

    d = Path(tempfile.mkdtemp(prefix="kloop-userns-", dir=top))
    os.chown(d, UID, UID)
    yield d
    subprocess.run(["rm", "-rf", str(d)], check=False)


def _contained_run(base: Path, run_harness, owner: int = UID) -> None:
    """`owner`: the harness's uid, which owns the victim (only the read-only tree stops it)."""
    os.chown(base, owner, owner)
    victim = base / "runs" / "turns.jsonl"
    victim.parent.mkdir()
    victim.write_text("")
    for p in (victim.parent, victim):
        os.chown(p, owner, owner)
    private = base / "cache" / "private"
    src = (REPO / "tests/evaluator/candidates/mlp_torch.py").read_text().replace(
        "import torch.nn as nn",
        f"import torch.nn as nn\n{PROBE}\n_probe({str(victim)!r}, {str(private)!r})\n", 1)
    (base / "cand.py").write_text(src)
    os.chown(base / "cand.py", owner, owner)
    script = base / "harness.py"
    script.write_text(HARNESS)
    out = run_harness(script)
    assert out.returncode == 0, out.stderr[-3000:]
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["userns"] and result["status"] == "correct", result
    assert "isolation_uncontained" not in result["flags"], result
    assert "isolation_same_uid" in result["flags"], result  # still the harness's uid: said so
    assert victim.read_text() == "", victim.read_text()
    rows = [json.loads(line) for f in (base / "work").rglob("seen.jsonl")
            for line in f.read_text().splitlines()]
    assert {r["child"] for r in rows} >= {"cand"}, rows
    for r in rows:
        assert r["pid"] == 1 and len(r["work"]) == 1, r  # alone, and only its own evaluation
        # The user's files: hidden (shared scratch shows only what the child needs) or, where
        # a run dir lies outside the private dirs, read-only.
        assert r["victim"] in ("ENOENT", "EROFS") and r["own"] == "ok", r
        assert r["private"] in ("EACCES", "EROFS", "ENOENT"), r  # the harness's cache: masked


def test_a_non_root_harness_contains_its_children_in_a_user_namespace(base):
    reach = _as_uid(sys.executable, "-c", "import subprocess, sys; "
                    "subprocess.run([sys.executable, '-c', 'import torch, evaluator'], check=True)",
                    cwd=base)
    if reach.returncode != 0:
        pytest.skip(f"uid {UID} cannot run this interpreter and repo: {reach.stderr[-200:]}")
    probe = _as_uid(sys.executable, "-c", "from evaluator import isolation; "
                    "print(isolation.userns_works())", cwd=base)
    if probe.stdout.strip() != "True":
        pytest.skip("this host forbids unprivileged user namespaces")
    _contained_run(base, lambda script: _as_uid(sys.executable, str(script), str(REPO),
                                                str(base), str(base / "cand.py"), cwd=base))


def test_the_user_namespace_path_as_root(base):
    """The same containment, started by a root harness told to use it (`KLOOP_FORCE_USERNS`,
    no sandbox uid): where the tests' uid cannot reach this interpreter (a venv under /root),
    this is how CI runs the non-root path's namespaces, masks and read-only tree."""
    env = {**os.environ, "KLOOP_FORCE_USERNS": "1"}
    _contained_run(base, lambda script: subprocess.run(
        [sys.executable, str(script), str(REPO), str(base), str(base / "cand.py"), "root"],
        capture_output=True, text=True, cwd=base, timeout=600, env=env), owner=0)
