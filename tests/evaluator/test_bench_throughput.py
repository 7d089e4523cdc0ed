"""bench/throughput.py end to end on CPU (its numbers mean nothing here; its plumbing does): a
`--compare` of the scheduler's look-ahead whose two passes share one warm-up, each pass judging
the batch's first candidates to the statuses they are built to get."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_a_compare_shares_one_warm_up_and_reports_both_passes(tmp_path):
    out = tmp_path / "throughput.json"
    p = subprocess.run(
        [sys.executable, str(REPO / "bench" / "throughput.py"), "--device", "cpu", "--first", "3",
         "--concurrency", "2", "--warm-baselines", "--eval", "baselines=eager",
         "--compare", "ahead=0,1", "--json", str(out)],
        capture_output=True, text=True, cwd=REPO, timeout=600)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    assert p.stdout.count("shared warm-up: every problem's baselines in") == 1, p.stdout
    # Each pass starts from a fresh cache holding the shared warm-up's baseline records only.
    seeded = [int(n) for n in re.findall(r"(\d+) baseline records from the shared warm-up",
                                         p.stderr)]
    assert len(seeded) == 2 and all(n >= 1 for n in seeded), p.stderr[-3000:]
    for name in ("ahead=0", "ahead=1"):
        block = p.stdout[p.stdout.index(f"== {name}:"):]
        rows = re.findall(r"^  (L3/1 triton \w+) +(\w+) ", block, re.M)[:3]
        assert rows == [("L3/1 triton syntax", "compile_error"),
                        ("L3/1 triton crash", "runtime_error"),
                        ("L3/1 triton wrong", "incorrect")], block
    assert "ahead=1 / ahead=0:" in p.stdout
    figures = json.loads(out.read_text())
    assert set(figures) == {"ahead=0", "ahead=1"}
    assert all(f["per_hour"] > 0 for f in figures.values())
