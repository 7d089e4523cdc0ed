"""Compare a problem implementation with the numeric fingerprints of the official files.

The fingerprint file (numbers only) records, for each official Level 3 problem built the
KernelBench way, every state_dict entry (key, shape, dtype, float64 sum and abs-sum) and the
outputs for seeds 0 and 1 at reduced sizes. `check_problem` rebuilds a problem the same way and
lists every difference; an empty list means the implementation matches.

Command line (used while writing problem files):
    python -m problems.fingerprint [STEM ...] [--fingerprints PATH]
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import sys
from pathlib import Path
from typing import Any

import torch

DEFAULT_FINGERPRINTS = Path(__file__).resolve().parents[1] / "tests" / "data" / "level3_fingerprints.json"
PARAM_RTOL = 1e-12
OUTPUT_RTOL_FLOOR = 1e-5


def _f64_sum(t: torch.Tensor) -> tuple[float, float]:
    flat = t.detach().reshape(-1)
    chunk = 1 << 24
    if flat.numel() <= chunk:
        d = flat.double()
        return d.sum().item(), d.abs().sum().item()
    sums, abs_sums = [], []
    for i in range(0, flat.numel(), chunk):
        d = flat[i : i + chunk].double()
        sums.append(d.sum().item())
        abs_sums.append(d.abs().sum().item())
    return math.fsum(sums), math.fsum(abs_sums)


def _close(a: float, b: float, rtol: float, scale: float) -> bool:
    return abs(a - b) <= rtol * max(abs(b), scale, 1e-30)


def load_fingerprints(path: Path = DEFAULT_FINGERPRINTS) -> dict[str, Any]:
    return json.loads(Path(path).read_text())["problems"]


def output_tolerance(expected: dict[str, Any]) -> float:
    """Ten times the problem's float32-vs-float64 spread, never below 1e-5 (see FINGERPRINTS.md)."""
    sens = expected.get("sensitivity", {}).get("f32_vs_f64_max_rel") or 0.0
    return max(OUTPUT_RTOL_FLOOR, 10 * sens)


def check_problem(path: Path, expected: dict[str, Any]) -> list[str]:
    """Rebuild the problem at `path` with the fingerprint's overrides; return the differences.
    Runs on two intra-op threads, as the fingerprints were made, and gives the caller its own
    setting back: a test process left at two threads beside another on a 2-core CI host ran a
    1 s LSTM forward in 50-95 s, each of its thousands of small ops waiting on a spinning
    OpenMP team (2026-12-05)."""
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        return _check_problem(path, expected)
    finally:
        torch.set_num_threads(before)


def _check_problem(path: Path, expected: dict[str, Any]) -> list[str]:
    from kloop.problems.registry import load_module

    diffs: list[str] = []
    module = load_module(path, expected.get("overrides") or {})
    torch.manual_seed(42)
    init = module.get_init_inputs()
    torch.manual_seed(42)
    model = module.Model(*init)
    sd = list(model.state_dict().items())
    exp_sd = expected["state_dict"]
    if [k for k, _ in sd] != [row[0] for row in exp_sd]:
        got_keys = [k for k, _ in sd]
        want_keys = [row[0] for row in exp_sd]
        extra = [k for k in got_keys if k not in want_keys][:5]
        missing = [k for k in want_keys if k not in got_keys][:5]
        diffs.append(f"state_dict keys differ: extra {extra}, missing {missing}, "
                     f"{len(got_keys)} vs {len(want_keys)} entries (order matters)")
        return diffs
    for (key, t), (_, shape, dtype, s, a) in zip(sd, exp_sd, strict=True):
        if list(t.shape) != shape or str(t.dtype).removeprefix("torch.") != dtype:
            diffs.append(f"{key}: shape/dtype {list(t.shape)} {t.dtype} vs {shape} {dtype}")
            continue
        gs, ga = _f64_sum(t)
        if not (_close(gs, s, PARAM_RTOL, a) and _close(ga, a, PARAM_RTOL, a)):
            diffs.append(f"{key}: sums {gs!r}/{ga!r} vs {s!r}/{a!r} (construction order?)")
    if diffs:
        return diffs
    rtol = output_tolerance(expected)
    for run in expected["runs"]:
        seed = run["seed"]
        torch.manual_seed(seed)
        inputs = module.get_inputs()
        got_in = [[list(x.shape), str(x.dtype).removeprefix("torch.")] for x in inputs]
        if got_in != [list(map(lambda v: v, i)) for i in run["inputs"]]:
            diffs.append(f"seed {seed}: inputs {got_in} vs {run['inputs']}")
            continue
        for i, (x, want) in enumerate(zip(inputs, run["input_sums"], strict=True)):
            if not _close(_f64_sum(x)[0], want, PARAM_RTOL, abs(want)):
                diffs.append(f"seed {seed}: input {i} sum {_f64_sum(x)[0]!r} vs {want!r}")
        with torch.no_grad():
            out = model(*inputs)
        outs = list(out) if isinstance(out, tuple | list) else [out]
        if len(outs) != len(run["outputs"]):
            diffs.append(f"seed {seed}: {len(outs)} outputs vs {len(run['outputs'])}")
            continue
        for j, (o, w) in enumerate(zip(outs, run["outputs"], strict=True)):
            tag = f"seed {seed} output {j}"
            if list(o.shape) != w["shape"] or str(o.dtype).removeprefix("torch.") != w["dtype"]:
                diffs.append(f"{tag}: shape/dtype {list(o.shape)} {o.dtype} vs {w['shape']} {w['dtype']}")
                continue
            gs, _ = _f64_sum(o)
            if not _close(gs, w["sum"], rtol, w["abs_sum"]):
                diffs.append(f"{tag}: sum {gs!r} vs {w['sum']!r} (abs_sum {w['abs_sum']!r}, rtol {rtol:g})")
            head = o.detach().reshape(-1)[: len(w["head"])].double().tolist()
            scale = max(abs(v) for v in w["head"]) or 1.0
            worst = max(abs(g - e) for g, e in zip(head, w["head"], strict=True)) / scale
            if worst > rtol:
                diffs.append(f"{tag}: head differs by {worst:.3g} relative (rtol {rtol:g})")
    del model, module
    gc.collect()
    return diffs


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("stems", nargs="*", help="problem stems, e.g. 4_LeNet5 (default: all)")
    parser.add_argument("--fingerprints", type=Path, default=DEFAULT_FINGERPRINTS)
    parser.add_argument("--dir", type=Path, default=Path(__file__).resolve().parent / "level3")
    args = parser.parse_args(argv)
    fps = load_fingerprints(args.fingerprints)
    stems = args.stems or list(fps)
    failed = 0
    for stem in stems:
        path = args.dir / f"{stem}.py"
        if not path.exists():
            print(f"MISSING {stem}")
            failed += 1
            continue
        try:
            diffs = check_problem(path, fps[stem])
        except Exception as e:  # report and go on: one broken file must not hide the others
            diffs = [f"raised {type(e).__name__}: {e}"]
        print(("OK      " if not diffs else "FAIL    ") + stem)
        for d in diffs[:10]:
            print("    " + d)
        failed += bool(diffs)
    print(f"{len(stems) - failed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
