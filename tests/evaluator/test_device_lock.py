"""GPU stages of evaluations in different processes never overlap when they share a lock dir
(`EvalConfig.device_lock = "host"`, the default), and do without one. Runs on CPU: the lock
only looks at the device name."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from evaluator.config import EvalConfig

_HOLDER = textwrap.dedent("""
    import sys, time
    from pathlib import Path
    from evaluator.state import device_lock
    lock_dir = Path(sys.argv[2]) if sys.argv[2] != "-" else None
    with device_lock("cuda:0", lock_dir):
        start = time.time()
        time.sleep(1.0)
        end = time.time()
    Path(sys.argv[1]).write_text(f"{start} {end}")
""")


def _intervals(tmp_path: Path, lock_dir: str) -> list[tuple[float, float]]:
    outs = [tmp_path / f"interval_{i}" for i in range(3)]
    procs = [subprocess.Popen([sys.executable, "-c", _HOLDER, str(o), lock_dir]) for o in outs]
    assert [p.wait(timeout=60) for p in procs] == [0, 0, 0]
    spans = [tuple(map(float, o.read_text().split())) for o in outs]
    return sorted(spans)  # type: ignore[arg-type]


def _overlaps(spans: list[tuple[float, float]]) -> bool:
    return any(b[0] < a[1] for a, b in zip(spans, spans[1:], strict=False))


def test_a_shared_lock_dir_serialises_processes(tmp_path):
    spans = _intervals(tmp_path, str(tmp_path / "locks"))
    assert not _overlaps(spans), spans
    assert (tmp_path / "locks" / "cuda_0.lock").exists()


def test_without_a_lock_dir_processes_overlap(tmp_path):
    # The control: the same holders overlap when nothing serialises them.
    assert _overlaps(_intervals(tmp_path, "-"))


def test_host_lock_is_the_default():
    assert EvalConfig().device_lock == "host"
    with pytest.raises(ValueError):
        EvalConfig(device_lock="global")
