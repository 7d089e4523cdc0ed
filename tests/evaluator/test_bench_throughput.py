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
    # The longest device-lock holds are named, with what they were made of.
    assert re.search(r"longest hold: L3/1 triton \w+ [\d.]+ s \(\d+% of the holds\)", p.stdout)
    figures = json.loads(out.read_text())
    assert set(figures) == {"ahead=0", "ahead=1"}
    assert all(f["per_hour"] > 0 for f in figures.values())


@pytest.mark.slow
def test_a_kept_warm_up_serves_a_later_run(tmp_path):
    """`--warm-only` fills a --baselines-cache and stops; a later run with the same dir seeds
    its fresh cache from it (the device warms in one call and times the batch in the next)."""
    warm = tmp_path / "warm"
    cmd = [sys.executable, str(REPO / "bench" / "throughput.py"), "--device", "cpu", "--first", "2",
           "--concurrency", "2", "--warm-baselines", "--eval", "baselines=eager",
           "--baselines-cache", str(warm)]
    first = subprocess.run([*cmd, "--warm-only"], capture_output=True, text=True, cwd=REPO,
                           timeout=600)
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
    assert "shared warm-up" in first.stdout and "== " not in first.stdout, first.stdout
    assert "warm L3/1" in first.stderr  # the reference was judged once, into the kept dir
    later = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO, timeout=600)
    assert later.returncode == 0, later.stdout[-3000:] + later.stderr[-3000:]
    assert "no shared warm-up" in later.stdout and "shared warm-up:" not in later.stdout
    seeded = re.findall(r"(\d+) baseline records from the shared warm-up", later.stderr)
    assert len(seeded) == 1 and int(seeded[0]) >= 1, later.stderr[-3000:]
    block = later.stdout[later.stdout.index("== this checkout:"):]
    assert re.findall(r"^  (L3/1 triton \w+) +(\w+) ", block, re.M) == [
        ("L3/1 triton syntax", "compile_error"), ("L3/1 triton crash", "runtime_error")], block
    no_flag = subprocess.run([*cmd[:-2], "--warm-only"], capture_output=True, text=True,
                             cwd=REPO, timeout=60)
    assert no_flag.returncode == 2 and "--warm-only wants" in no_flag.stderr


def test_the_lean_cuda_form_swaps_only_the_cuda_candidates_for_their_lean_forms():
    """`--cuda-form lean`: the same batch, problems and sizes, with the three CUDA candidates'
    lean forms (the form the CUDA prompt asks for) in place of the ones whose `.cu` uses torch."""
    code = ("import json, sys; sys.path.insert(0, 'bench'); import throughput as t; "
            "print(json.dumps([t.batch(cuda_form=f) for f in ('torch', 'lean')]))")
    torch_form, lean_form = json.loads(subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True,
        check=True).stdout)
    assert [(i["problem"], i["overrides"]) for i in torch_form] == \
        [(i["problem"], i["overrides"]) for i in lean_form]
    changed = [(a["label"], b["label"]) for a, b in zip(torch_form, lean_form, strict=True)
               if a["source"] != b["source"]]
    assert changed == [(f"{p} cuda {n}.py", f"{p} cuda {n}_lean.py") for p, n in (
        ("L3/1", "mlp_cuda_relu"), ("L3/43", "attention_cuda"),
        ("L3/8", "resnet_block_bn_relu_cuda"))]
    assert all("load_inline" in b["source"] and "torch::" not in b["source"].split(
        "cuda_source = ", 1)[1].split('"""', 2)[1]
        for a, b in zip(torch_form, lean_form, strict=True) if a["source"] != b["source"])
