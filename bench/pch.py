"""The binding translation unit of a `load_inline` build, with and without a precompiled header,
side by side (any machine with g++; the CUDA side is not built here).

    python bench/pch.py [--n 3]

`load_inline` writes a `main.cpp` that includes <torch/extension.h> and binds the declared
functions, and compiles it with the host compiler; measured on the H200 (research anchors) it
takes ~20 s of a ~57 s cold build. This builds `load_inline`'s own build files for a small
CPU extension (so the command and flags are torch's), then times that compile command as is,
and again with `-include` of a header whose precompiled form (`.gch`, made once with the same
flags) the compiler picks up; `-Winvalid-pch` makes an unusable PCH an error, not a silent
fallback. Prints the median of `n` builds of each and the one-off cost of the PCH.
"""

from __future__ import annotations

import argparse
import re
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

CPP = """
#include <torch/extension.h>
torch::Tensor twice(torch::Tensor x) { return x * 2; }
"""


def ninja_command(build: Path) -> list[str]:
    """The compile command of main.cpp from the build.ninja `load_inline` wrote."""
    text = (build / "build.ninja").read_text()
    cxx = re.search(r"^cxx = (.*)$", text, re.M).group(1)  # type: ignore[union-attr]
    cflags = re.search(r"^cflags = (.*)$", text, re.M).group(1)  # type: ignore[union-attr]
    post = re.search(r"^post_cflags = (.*)$", text, re.M)
    return [*shlex.split(cxx), "-MMD", "-MF", "main.o.d", *shlex.split(cflags), "-c",
            "main.cpp", "-o", "main.o", *(shlex.split(post.group(1)) if post else [])]


def timed(cmd: list[str], cwd: Path) -> float:
    t0 = time.monotonic()
    r = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd[:3])}...: {r.stderr[-2000:]}")
    return time.monotonic() - t0


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=3)
    args = ap.parse_args()
    from torch.utils.cpp_extension import load_inline

    work = Path(tempfile.mkdtemp(prefix="kloop-pch-"))
    build = work / "ext"
    build.mkdir()
    t0 = time.monotonic()
    load_inline("kloop_pch_probe", cpp_sources=CPP, functions=["twice"], build_directory=str(build),
                verbose=False)
    first = time.monotonic() - t0
    cmd = ninja_command(build)
    pch_dir = work / "pch"
    pch_dir.mkdir()
    header = pch_dir / "torch_ext.h"
    header.write_text("#include <torch/extension.h>\n")
    # The PCH takes main.cpp's exact flags (same -D, -I, -std, -O, -fPIC), compiled as a header,
    # ...except the extension's name: it appears only in main.cpp's binding, and one PCH has to
    # serve every extension (GCC refuses a PCH made under another value of a -D macro).
    make_pch = [a for a in cmd if a not in ("-c", "main.cpp", "-o", "main.o", "-MMD", "-MF",
                                             "main.o.d")
                and not a.startswith("-DTORCH_EXTENSION_NAME=")]
    make_pch += ["-x", "c++-header", str(header), "-o", str(header) + ".gch"]
    pch_s = timed(make_pch, build)
    with_pch = [*cmd, "-Winvalid-pch", "-Werror=invalid-pch", "-include", str(header)]
    # Another extension (another candidate) has another TORCH_EXTENSION_NAME: the same PCH must
    # serve it (the macro appears only in main.cpp's binding, not in the headers).
    other = [re.sub(r"-DTORCH_EXTENSION_NAME=\S+", "-DTORCH_EXTENSION_NAME=another_one", a)
             for a in with_pch]
    plain, fast, reused = [], [], []
    for _ in range(args.n):
        plain.append(timed(cmd, build))
        fast.append(timed(with_pch, build))
        reused.append(timed(other, build))
    print(f"load_inline, first build (both translation units, link): {first:.1f} s")
    print(f"making the PCH once: {pch_s:.1f} s ({(Path(str(header) + '.gch').stat().st_size >> 20)} MiB)")
    print(f"main.cpp plain:    median {statistics.median(plain):.1f} s  {[round(x, 1) for x in plain]}")
    print(f"main.cpp with PCH: median {statistics.median(fast):.1f} s  {[round(x, 1) for x in fast]}")
    print(f"main.cpp with PCH, another extension's name: median {statistics.median(reused):.1f} s")
    print(f"ratio plain / PCH: {statistics.median(plain) / statistics.median(fast):.2f}")
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
