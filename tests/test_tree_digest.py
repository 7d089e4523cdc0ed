"""scripts/tree_digest.sh: the digest that ties a device call to a commit (the device's copy of
.git is stale): it follows the files' content, not the index, and leaves out what the device
copy does not carry (ignored files, bytecode)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def digest(root: Path) -> str:
    p = subprocess.run(["bash", "scripts/tree_digest.sh"], cwd=root, capture_output=True,
                       text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    return p.stdout.strip()


def test_the_digest_follows_the_code_and_not_what_the_device_copy_leaves_out(tmp_path):
    (tmp_path / "scripts").mkdir()
    shutil.copy(REPO / "scripts" / "tree_digest.sh", tmp_path / "scripts")
    for name, text in {"agent/loop.py": "x = 1\n", "evaluator/clock.py": "y = 2\n",
                       "pyproject.toml": "[project]\n", ".gitignore": "agent/gen/\n"}.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    subprocess.run(["git", "init", "-q"], cwd=tmp_path, check=True)
    first = digest(tmp_path)
    assert len(first) == 16
    (tmp_path / "agent" / "__pycache__").mkdir()
    (tmp_path / "agent" / "__pycache__" / "loop.cpython-312.pyc").write_bytes(b"\0")
    (tmp_path / "agent" / "gen").mkdir()
    (tmp_path / "agent" / "gen" / "made.py").write_text("z = 3\n")  # ignored: never carried
    assert digest(tmp_path) == first
    subprocess.run(["git", "add", "-A"], cwd=tmp_path, check=True)  # the index changes nothing
    assert digest(tmp_path) == first
    (tmp_path / "evaluator" / "clock.py").write_text("y = 3\n")
    assert digest(tmp_path) != first
