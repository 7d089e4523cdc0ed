"""How much of a cold CUDA build is `<torch/types.h>`, for a `.cu` whose own text names nothing
of torch (any machine with nvcc: compile only). Side by side in one run, for each kernel:

- `load_inline`: the file as `load_inline` writes it (`<torch/types.h>`, `<cuda.h>`,
  `<cuda_runtime.h>`, then the kernel's text);
- `lean`: the same text after the standard and CUDA headers `<torch/types.h>` itself includes
  (found here with the host preprocessor's `-H`, for this torch and compiler), and no torch.

Both compile with torch's own nvcc flags for one architecture (`-O3`, sm_90 unless `--arch`),
one after the other; printed: seconds each, the ratio, and whether the two objects hold the
same device code (`cuobjdump -sass`, the functions in order). The lean prologue and the
macro gap are `evaluator.build.lean`'s, which kloop builds with under `lean_cuda: on`.

    python bench/lean_prologue.py [--arch 90] [--repeats 1]
"""

from __future__ import annotations

import argparse
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path[:0] = [str(Path(__file__).resolve().parents[1])]

from kloop.evaluator.build import lean  # noqa: E402

PROLOGUE = "".join(line + "\n" for line in lean.PROLOGUE)
"""What `load_inline` puts in front of `cuda_sources`."""

KERNELS = {
    "relu": r"""
__global__ void relu_kernel(const float* __restrict__ x, float* __restrict__ y, long n) {
    long i = (long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = fmaxf(x[i], 0.0f);
}
void relu_launch(const float* x, float* y, long n, cudaStream_t stream) {
    relu_kernel<<<(unsigned)((n + 255) / 256), 256, 0, stream>>>(x, y, n);
}
""",
    # Math, warp shuffles, shared memory and a template: what an attention row kernel uses.
    "softmax": r"""
template <int BLOCK>
__global__ void softmax_rows(const float* __restrict__ x, float* __restrict__ y, int cols) {
    __shared__ float part[BLOCK / 32];
    const float* row = x + (long)blockIdx.x * cols;
    float m = -INFINITY;
    for (int c = threadIdx.x; c < cols; c += BLOCK) m = fmaxf(m, row[c]);
    for (int o = 16; o > 0; o /= 2) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
    if (threadIdx.x % 32 == 0) part[threadIdx.x / 32] = m;
    __syncthreads();
    m = part[0];
    for (int w = 1; w < BLOCK / 32; ++w) m = fmaxf(m, part[w]);
    __syncthreads();
    float s = 0.0f;
    for (int c = threadIdx.x; c < cols; c += BLOCK) s += expf(row[c] - m);
    for (int o = 16; o > 0; o /= 2) s += __shfl_xor_sync(0xffffffffu, s, o);
    if (threadIdx.x % 32 == 0) part[threadIdx.x / 32] = s;
    __syncthreads();
    s = 0.0f;
    for (int w = 0; w < BLOCK / 32; ++w) s += part[w];
    for (int c = threadIdx.x; c < cols; c += BLOCK)
        y[(long)blockIdx.x * cols + c] = expf(row[c] - m) / s;
}
void softmax_launch(const float* x, float* y, int rows, int cols, cudaStream_t stream) {
    softmax_rows<256><<<rows, 256, 0, stream>>>(x, y, cols);
}
""",
}


def torch_flags(arch: str) -> list[str]:
    from torch.utils import cpp_extension as ce

    return [*(f"-I{p}" for p in ce.include_paths()), *getattr(ce, "COMMON_NVCC_FLAGS", []),
            "-std=c++17", "-O3", f"-gencode=arch=compute_{arch},code=sm_{arch}", "-Xcompiler",
            "-fPIC"]


def compile_once(nvcc: str, flags: list[str], src: Path) -> tuple[float, Path]:
    obj = src.with_suffix(".o")
    t = time.monotonic()
    r = subprocess.run([nvcc, *flags, "-c", str(src), "-o", str(obj)], capture_output=True,
                       text=True)
    took = time.monotonic() - t
    if r.returncode != 0:
        raise SystemExit(f"{src.name} failed:\n{r.stderr[-3000:]}")
    return took, obj


def sass(cuobjdump: str, obj: Path) -> list[str]:
    """The device code's instructions, function by function (addresses and comments dropped)."""
    r = subprocess.run([cuobjdump, "-sass", str(obj)], capture_output=True, text=True)
    out = []
    for line in r.stdout.splitlines():
        line = re.sub(r"/\*[0-9a-f]{4,}\*/", "", line).split(";")[0].strip()
        if line.startswith(("Function", "/*")) or re.match(r"[A-Z@]", line):
            out.append(line)
    return out


def find_cuobjdump(nvcc: str) -> str | None:
    """On PATH, beside nvcc, or the copy Triton ships."""
    beside = Path(nvcc).resolve().with_name("cuobjdump")
    if found := shutil.which("cuobjdump") or (str(beside) if beside.exists() else None):
        return found
    try:
        import triton

        bundled = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
        return str(bundled) if bundled.exists() else None
    except ImportError:
        return None


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--arch", default="90")
    ap.add_argument("--repeats", type=int, default=1)
    args = ap.parse_args()
    nvcc = shutil.which("nvcc")
    if nvcc is None:
        print("no nvcc on PATH")
        return 1
    flags = torch_flags(args.arch)
    dump = find_cuobjdump(nvcc)
    with tempfile.TemporaryDirectory(prefix="kloop-lean-") as tmp:
        work = Path(tmp)
        t = time.monotonic()
        found = lean.facts(nvcc, [*flags, "-c", "x.cu"], "x.cu", work)
        if found is None:
            print("the preprocessor's facts could not be had: no lean prologue")
            return 1
        names = found.headers
        print(f"{len(names)} headers outside torch that <torch/types.h> includes "
              f"(found in {time.monotonic() - t:.1f} s): {' '.join(names)}")
        other = sorted(m for m in found.torch_macros if not m.startswith(lean.TORCH_PREFIXES))
        print(f"{len(found.torch_macros)} macros only torch's header defines; "
              f"{len(other)} without a torch prefix: {' '.join(other[:30])}"
              f"{' ...' if len(other) > 30 else ''}")
        prologue = lean.prologue_text(names)
        print(f"{'kernel':10} {'load_inline s':>14} {'lean s':>8} {'ratio':>7}  same device code")
        for kernel, text in KERNELS.items():
            times: dict[str, list[float]] = {"full": [], "lean": []}
            objs: dict[str, Path] = {}
            for _ in range(args.repeats):
                for mode, head in (("full", PROLOGUE), ("lean", prologue)):
                    src = work / f"{kernel}_{mode}.cu"
                    src.write_text(head + text)
                    took, objs[mode] = compile_once(nvcc, flags, src)
                    times[mode].append(took)
            full, light = (statistics.median(times[m]) for m in ("full", "lean"))
            if dump is None:
                same = "no cuobjdump"
            else:
                code = [sass(dump, objs[m]) for m in ("full", "lean")]
                same = "yes" if code[0] == code[1] and code[0] else "NO"
            print(f"{kernel:10} {full:14.1f} {light:8.1f} {light / full:7.2f}  {same}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
