"""One writable place per evaluation: a note that one evaluation's candidate code leaves in
every place it can write (its cache dir, its home, scratch, /dev/shm, anything writable within
three levels of the root or of a directory its environment names) is not there for the next
evaluation's candidate code to find, under every harness mode this machine has.

Each mode runs a harness of its own in a subprocess; both candidates report through their
exception text only (how many places were written; how many notes were found)."""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import pytest
from test_host_secrets import NOBODY, REPO, _mode_available

WALK = '''
import os as _o


def _dirs():
    env = [v for v in _o.environ.values() if v.startswith("/") and _o.path.isdir(v)]
    tops = [*env, "/tmp", "/var/tmp", "/dev/shm", "/run/lock", _o.getcwd(), "/"]
    seen = set()
    for top in tops:
        for d, subdirs, _files in _o.walk(top):
            if d in seen or d.startswith(("/proc", "/sys")) or \\
                    (d.startswith("/dev") and not d.startswith("/dev/shm")):
                subdirs[:] = []
                continue
            seen.add(d)
            if d.count("/") - top.rstrip("/").count("/") >= 3:
                subdirs[:] = []
            yield d
'''

WRITER = WALK + '''

def _leave(name, note):
    written = 0
    for d in _dirs():
        try:
            with open(_o.path.join(d, name), "w") as f:
                f.write(note)
            written += 1
        except OSError:
            pass
    return written


raise RuntimeError(f"WROTE {{_leave({name!r}, {note!r})}}")
'''

READER = WALK + '''

def _look(name):
    found = []
    for d in _dirs():
        try:
            with open(_o.path.join(d, name)) as f:
                found.append(f.read())
        except OSError:
            pass
    return found


_found = _look({name!r})
raise RuntimeError(f"FOUND {{len(_found)}} {{' '.join(_found)}}")
'''

HARNESS = textwrap.dedent('''
    import sys
    from pathlib import Path
    sys.path[:0] = [sys.argv[1], sys.argv[1] + "/tests/evaluator"]
    from eval_helpers import cpu_config
    from kloop.evaluator.harness.pipeline import evaluate
    base = Path(sys.argv[2])
    extra = {"sandbox_uid": None} if sys.argv[3] != "pool" else {}
    config = cpu_config(base / "cache", work_root=base / "work", **extra)
    for name in ("writer.py", "reader.py"):
        print(evaluate("L3/1", (base / name).read_text(), config).model_dump_json())
''')


@pytest.fixture
def base():
    if os.geteuid() != 0:
        pytest.skip("runs harnesses of several identities: needs root")
    top = next(d for d in ("/var/lib", "/opt", "/") if os.path.isdir(d))
    d = Path(tempfile.mkdtemp(prefix="kloop-notes-", dir=top))
    d.chmod(0o777)
    os.chown(d, NOBODY, NOBODY)
    yield d
    subprocess.run(["rm", "-rf", str(d)], check=False)


@pytest.mark.parametrize("mode", ["pool", "root_no_pool", "userns", "non_root"])
def test_a_note_left_by_one_evaluation_is_not_found_by_the_next(base, mode):
    why = _mode_available(mode)
    if why is not None:
        pytest.skip(why)
    name, note = f".kloop-note-{secrets.token_hex(4)}", f"note-{secrets.token_hex(8)}"
    source = (REPO / "tests/evaluator/candidates/mlp_torch.py").read_text()
    for file, code in (("writer.py", WRITER), ("reader.py", READER)):
        (base / file).write_text(source.replace(
            "import torch.nn as nn", "import torch.nn as nn\n" + code.format(name=name,
                                                                              note=note), 1))
    (base / "harness.py").write_text(HARNESS)
    env = {**os.environ}
    argv = [sys.executable, str(base / "harness.py"), str(REPO), str(base), mode]
    if mode == "userns":
        env["KLOOP_FORCE_USERNS"] = "1"
    if mode == "non_root":
        argv = ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", *argv]
    out = subprocess.run(argv, capture_output=True, text=True, cwd=base, env=env, timeout=900)
    assert out.returncode == 0, out.stderr[-3000:]
    wrote, read = (json.loads(line) for line in out.stdout.splitlines() if line.startswith("{"))
    for r in (wrote, read):
        assert "isolation_uncontained" not in r["flags"], r["flags"]
    # The writer found at least its own dirs (home, TMPDIR, /dev/shm) writable.
    assert wrote["error"]["message"].startswith("WROTE "), wrote["error"]
    assert int(wrote["error"]["message"].split()[1]) >= 2, wrote["error"]
    assert read["error"]["message"].split()[:2] == ["FOUND", "0"], read["error"]
    assert not [p for p in Path("/").glob(f"*/{name}")]  # nothing on the host either
