"""A `.cu` that includes `<torch/extension.h>`, built by kloop's nvcc the plain way (host and
device chains side by side) and as two halves (`evaluator.build.torch_form`), one after the
other on this host; nvcc and g++ only (no GPU needed, no link).

    python bench/torch_form.py [--sources mlp_cuda_relu.py,attention_cuda.py] [--pch DIR]

Each source is a candidate file of tests/evaluator/candidates/ (its `cuda_source`). The flags
are torch's for `load_inline` (`-O3` as extra CUDA flags, C++17). `--pch DIR`: make a
precompiled `<torch/extension.h>` for the host half's flags there first (as the trusted builder
does for the binding file; its time printed apart) and build the halves with it; without it the
host half reads the header. Prints one line per build and the ratio split / plain per source.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from kloop.evaluator.build import cxx_pch, lean, nvcc, nvcc_parallel  # noqa: E402

CANDIDATES = ROOT / "tests" / "evaluator" / "candidates"


def torch_args(source: Path, out: Path) -> list[str]:
    """What torch's `load_inline` passes its nvcc for `cuda.cu` (no dependency file: kloop's
    builds skip it), with the toolkit's headers named where a CPU torch does not."""
    from torch.utils import cpp_extension as ce

    try:
        includes = ce.include_paths("cuda")
    except OSError:  # a CPU torch: no CUDA_HOME; the SDK headers the CPU check installs
        includes = [*ce.include_paths(), *nvcc._toolkit_include_dirs(),
                    *([str(nvcc.SDK_HEADERS_DIR / "include")]
                      if (nvcc.SDK_HEADERS_DIR / "include").is_dir() else [])]
    common = ["-DTORCH_EXTENSION_NAME=kloop_bench_tf", "-DTORCH_API_INCLUDE_EXTENSION_H"]
    for p in [*includes, sysconfig.get_path("include", scheme="posix_prefix")]:
        common += ["-isystem", p]
    return [*common, *ce.COMMON_NVCC_FLAGS, "-gencode=arch=compute_90,code=sm_90",
            "--compiler-options", "'-fPIC'", "-O3", "-std=c++17", "-c", str(source), "-o",
            str(out)]


def cuda_text(name: str) -> str:
    text = (CANDIDATES / name).read_text()
    return text.split('cuda_source = r"""', 1)[1].split('"""', 1)[0]


def make_pch(root: Path) -> float:
    """A PCH entry for the host half's flags, made as `evaluator.build.pch` makes the binding's:
    the forwarding header compiled as a header; seconds taken."""
    args = torch_args(Path("x.cu"), Path("x.o"))
    got = nvcc_parallel.host_compile(args, "x.cu")
    assert not isinstance(got, str), got
    flags = [f for f in got[0][got[0].index("-Wno-psabi") + 1:]
             if not f.startswith("-DTORCH_EXTENSION_NAME=")]
    real = os.environ.get(cxx_pch.REAL_ENV) or "c++"
    entry = root / cxx_pch.pch_key(real, flags)
    header = entry / cxx_pch.HEADER
    header.parent.mkdir(parents=True, exist_ok=True)
    header.write_text(cxx_pch.FORWARD)
    start = time.monotonic()
    subprocess.run([real, *flags, "-x", "c++-header", str(header), "-o", f"{header}.gch"],
                   check=True, capture_output=True)
    (entry / cxx_pch.READY).write_text("")
    return time.monotonic() - start


def build(work: Path, text: str, split: bool, pch_root: Path | None) -> dict:
    work.mkdir(parents=True)
    source = work / "cuda.cu"
    source.write_text("\n".join(lean.PROLOGUE) + "\n" + text)
    report = work / "report"
    env = {k: v for k, v in os.environ.items() if k not in (lean.ENV, cxx_pch.ROOT_ENV)}
    env[nvcc_parallel.REPORT_ENV] = str(report)
    if split:
        env[lean.ENV] = "1"
        if pch_root is not None:
            env[cxx_pch.ROOT_ENV] = str(pch_root)
    start = time.monotonic()
    r = subprocess.run([sys.executable, nvcc_parallel.__file__,
                        *torch_args(source, work / "cuda.cuda.o")],
                       capture_output=True, text=True, env=env)
    seconds = time.monotonic() - start
    return {"ok": r.returncode == 0, "seconds": round(seconds, 2),
            "path": report.read_text().splitlines() if report.exists() else [],
            "error": r.stderr[-500:] if r.returncode else None}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sources", default="mlp_cuda_relu.py,attention_cuda.py")
    ap.add_argument("--pch", type=Path, default=None)
    ap.add_argument("--json", type=Path, default=None)
    a = ap.parse_args()
    if shutil.which("nvcc") is None:
        print("needs nvcc", file=sys.stderr)
        return 2
    rows: list[dict] = []
    pch_s = make_pch(a.pch) if a.pch else None
    if pch_s is not None:
        print(f"precompiled header for the host half: {pch_s:.1f} s (once per host and flags)")
    with tempfile.TemporaryDirectory(prefix="kloop-bench-tf-") as tmp:
        for name in a.sources.split(","):
            text = cuda_text(name)
            plain = build(Path(tmp) / name / "plain", text, False, None)
            halves = build(Path(tmp) / name / "split", text, True, a.pch)
            ratio = halves["seconds"] / plain["seconds"] if plain["seconds"] else None
            print(f"{name}: plain {plain['seconds']:.1f} s {plain['path']}; two halves "
                  f"{halves['seconds']:.1f} s {halves['path']}; ratio {ratio:.2f}")
            rows.append({"source": name, "plain": plain, "halves": halves, "ratio": ratio})
    if a.json:
        a.json.write_text(json.dumps({"pch_s": pch_s, "rows": rows}, indent=1))
    return 0 if all(r["plain"]["ok"] and r["halves"]["ok"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
