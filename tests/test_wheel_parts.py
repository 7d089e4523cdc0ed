"""scripts/wheel_parts.sh: a wheel too large for one device call travels in two parts and is
joined on the machine only if it is byte for byte the wheel that was split."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "scripts" / "wheel_parts.sh"
NAME = "big-1.0-cp312-cp312-manylinux2014_x86_64.whl"


def parts(*args: str | Path, cwd: Path, part_bytes: int = 1_000_000) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(SCRIPT), *map(str, args)], cwd=cwd, capture_output=True,
                          text=True, timeout=60, env={**os.environ, "PART_BYTES": str(part_bytes)})


def test_a_wheel_split_in_two_folders_joins_to_the_same_bytes(tmp_path):
    wheel = tmp_path / NAME
    wheel.write_bytes(os.urandom(2_500_000))
    split = parts("split", wheel, "a", "b", cwd=tmp_path)
    assert split.returncode == 0, split.stderr
    a, b = tmp_path / "a" / f"{NAME}.part-a", tmp_path / "b" / f"{NAME}.part-b"
    assert (a.stat().st_size, b.stat().st_size) == (1_000_000, 1_500_000)
    assert not (tmp_path / "a" / f"{NAME}.sha256").exists()  # the second call carries it
    # On the machine: the first part was left in a folder of its own by the first call.
    (tmp_path / "stage").mkdir()
    os.replace(a, tmp_path / "stage" / a.name)
    joined = parts("join", "stage", "b", "out", cwd=tmp_path)
    assert joined.returncode == 0, joined.stderr
    assert joined.stdout.strip() == f"out/{NAME}"
    assert (tmp_path / "out" / NAME).read_bytes() == wheel.read_bytes()


def test_a_part_that_changed_or_is_missing_joins_to_nothing(tmp_path):
    wheel = tmp_path / NAME
    wheel.write_bytes(os.urandom(1_200_000))
    assert parts("split", wheel, "a", "b", cwd=tmp_path).returncode == 0
    with open(tmp_path / "b" / f"{NAME}.part-b", "r+b") as f:
        f.seek(10)
        f.write(b"\x00" if f.read(1) != b"\x00" else b"\x01")
    bad = parts("join", "a", "b", "out", cwd=tmp_path)
    assert bad.returncode == 1 and "does not match its sha256" in bad.stderr
    assert not (tmp_path / "out" / NAME).exists()
    (tmp_path / "a" / f"{NAME}.part-a").unlink()
    gone = parts("join", "a", "b", "out", cwd=tmp_path)
    assert gone.returncode == 1 and "part-a is missing" in gone.stderr
