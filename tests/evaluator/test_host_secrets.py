"""Nothing of the host reaches the model: candidate code that goes looking for the host's
secrets (/etc/shadow, the names and contents of files in the harness user's ~/.config) finds
nothing, under every harness mode `kloop check` lists that this machine has, and what it says
about what it found never reaches the result.

Each mode runs a harness of its own in a subprocess (its HOME is a planted home directory, its
identity and namespaces are the mode's); the result's JSON is searched for every marker."""

from __future__ import annotations

import hashlib
import json
import os
import secrets
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
NOBODY = 65534

LOOTER = '''
import hashlib as _h, os as _o, sys as _s


def _loot():
    found = []
    # Names are found, never given: the candidate's own source reaches the result as it is.
    paths = ["/etc/shadow", "/etc/gshadow"]
    for top in ({config!r}, "/root/.config"):
        for d, _dirs, files in _o.walk(top):
            paths += [_o.path.join(d, f) for f in files]
    for path in paths:
        try:
            data = open(path, "rb").read()
            found.append(f"{{path}}={{data[:80]!r}}:{{_h.sha256(data).hexdigest()}}")
        except OSError as e:
            found.append(f"{{path}}:{{e.errno}}")
    for d in ({config!r}, {home!r}, "/root", "/root/.config", "/home"):
        try:
            found.append(f"{{d}}:{{','.join(sorted(_o.listdir(d)))}}")
        except OSError as e:
            found.append(f"{{d}}:{{e.errno}}")
    return " ".join(found)


_s.stderr.write("LOOT " + _loot() + "\\n")
raise RuntimeError("LOOT " + _loot())
'''

HARNESS = textwrap.dedent('''
    import json, sys
    from pathlib import Path
    sys.path[:0] = [sys.argv[1], sys.argv[1] + "/tests/evaluator"]
    from eval_helpers import candidate, cpu_config
    from kloop.evaluator.harness.pipeline import evaluate
    base, looter = Path(sys.argv[2]), Path(sys.argv[3]).read_text()
    extra = {"sandbox_uid": None} if sys.argv[4] != "pool" else {}
    config = cpu_config(base / "cache", work_root=base / "work", **extra)
    for source in (looter, candidate("mlp_torch.py")):
        print(evaluate("L3/1", source, config).model_dump_json())
''')


def _markers(name: str, content: str) -> list[str]:
    out = [name, content]
    for path in ("/etc/shadow", "/etc/gshadow"):
        try:
            data = Path(path).read_bytes()
        except OSError:
            continue
        out.append(hashlib.sha256(data).hexdigest())
        out += [line.decode(errors="replace") for line in data.splitlines()[:3]
                if line.count(b":") >= 2]
    return out


@pytest.fixture
def planted():
    """A home directory others may read (so modes alone would show it to any uid) with a
    secret in .config; outside shared scratch, where every mode's harness can write."""
    if os.geteuid() != 0:
        pytest.skip("plants a home directory for harnesses of several identities: needs root")
    top = next(d for d in ("/var/lib", "/opt", "/") if os.path.isdir(d))
    home = Path(tempfile.mkdtemp(prefix="kloop-home-", dir=top))
    name, content = f"kloop-planted-{secrets.token_hex(6)}", f"secret-{secrets.token_hex(12)}"
    (home / ".config").mkdir()
    (home / ".config" / name).write_text(content)
    base = home / "base"
    base.mkdir()
    for p in (home, home / ".config", home / ".config" / name, base):
        p.chmod(0o777 if p == base else 0o755 if p.is_dir() else 0o644)
    os.chown(base, NOBODY, NOBODY)
    yield home, base, name, content
    subprocess.run(["rm", "-rf", str(home)], check=False)


def _run(mode: str, home: Path, base: Path, name: str) -> list[dict]:
    source = REPO / "tests/evaluator/candidates/mlp_torch.py"
    looter = source.read_text().replace("import torch.nn as nn", "import torch.nn as nn\n" + (
        LOOTER.format(config=str(home / ".config"), home=str(home))), 1)
    (base / "looter.py").write_text(looter)
    (base / "harness.py").write_text(HARNESS)
    env = {**os.environ, "HOME": str(home)}
    argv = [sys.executable, str(base / "harness.py"), str(REPO), str(base),
            str(base / "looter.py"), mode]
    if mode == "userns":
        env["KLOOP_FORCE_USERNS"] = "1"
    if mode == "non_root":
        argv = ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", *argv]
    out = subprocess.run(argv, capture_output=True, text=True, cwd=base, env=env, timeout=900)
    assert out.returncode == 0, out.stderr[-3000:]
    return [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]


def _mode_available(mode: str) -> str | None:
    """Why `mode` cannot run on this machine, or None."""
    from kloop.evaluator.procs import isolation

    if mode == "pool":
        plan = isolation.plan_sandbox(2_000_000_000, False, REPO / "problems")
        return None if not plan.same_uid else f"no pool uid here ({plan.reason})"
    if mode == "non_root":
        probe = subprocess.run(
            ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups",
             sys.executable, "-c", "from evaluator import isolation; "
             "print(isolation.userns_works())"],
            capture_output=True, text=True, cwd=REPO, timeout=300)
        if probe.stdout.strip() != "True":
            return f"uid {NOBODY} cannot run this interpreter, or user namespaces are forbidden"
    if mode == "userns":
        probe = subprocess.run(
            [sys.executable, "-c", "from evaluator import isolation; "
             "print(isolation.userns_works())"], capture_output=True, text=True, cwd=REPO,
            env={**os.environ, "KLOOP_FORCE_USERNS": "1"}, timeout=300)
        if probe.stdout.strip() != "True":
            return "this host forbids user namespaces"
    return None


@pytest.mark.parametrize("mode", ["pool", "root_no_pool", "userns", "non_root"])
def test_candidate_code_finds_no_host_secret(planted, mode):
    why = _mode_available(mode)
    if why is not None:
        pytest.skip(why)
    home, base, name, content = planted
    looted, honest = _run(mode, home, base, name)
    assert honest["status"] == "correct", honest["error"]
    assert "isolation_uncontained" not in looted["flags"], looted["flags"]
    # The looter ran and said what it found: the result carries its (cut) exception.
    assert looted["status"] == "runtime_error" and "LOOT" in looted["error"]["message"], looted
    text = json.dumps(looted)
    leaked = [m for m in _markers(name, content) if m in text]
    assert not leaked, (leaked, looted["error"])
