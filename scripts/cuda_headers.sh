#!/usr/bin/env bash
# Headers of the CUDA math libraries, for nvcc compile checks on a machine without a GPU.
#
# torch's CUDA headers pull in library headers that nvcc does not ship: ATen/cuda/CUDAContext.h
# includes cusparse.h, cublas_v2.h, cublasLt.h and cusolverDn.h; kernels also include
# curand_kernel.h and cufft.h. Without them the check of such a candidate stops at the first
# missing header and the result says `compile_check_incomplete`. PyPI carries these headers only
# inside the libraries' runtime wheels (about 1 GB together), so this script downloads the wheels
# for the CUDA release of the installed nvcc, keeps their include/ directories (about 3 MB) in
# $VENV/cuda-headers/include, where evaluator/build/nvcc.py looks, and deletes the wheels.
#
# Skipped with a GPU (a CUDA torch brings these libraries, headers included) and without nvcc
# (nothing would use them). Idempotent: VERSIONS records what is installed.
# Override the wheel list with CUDA_HEADER_WHEELS="nvidia-cublas==... ...".
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${VENV:-.venv}
DEST="$VENV/cuda-headers"

if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
  exit 0
fi
if ! command -v nvcc >/dev/null 2>&1; then
  echo "cuda_headers: no nvcc here, CUDA compile checks are off; no headers installed"
  exit 0
fi
cuda_major=$(nvcc --version | sed -n 's/.*release \([0-9]*\)\..*/\1/p' | head -1)
case "$cuda_major" in
  # The library releases of CUDA 13.0 (the headers of a later release may need a newer nvcc).
  13) default_wheels="nvidia-cublas==13.0.0.19 nvidia-cusparse==12.6.2.49
nvidia-cusolver==12.0.3.29 nvidia-curand==10.4.0.35 nvidia-cufft==12.0.0.15" ;;
  *)
    if [ -z "${CUDA_HEADER_WHEELS:-}" ]; then
      echo "cuda_headers: no pinned header wheels for CUDA $cuda_major; set CUDA_HEADER_WHEELS"
      exit 0
    fi ;;
esac
# shellcheck disable=SC2206
wheels=(${CUDA_HEADER_WHEELS:-$default_wheels})
stamp="${wheels[*]}"
if [ -f "$DEST/VERSIONS" ] && [ "$(cat "$DEST/VERSIONS")" = "$stamp" ]; then
  exit 0
fi

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
"$VENV/bin/python" -m pip --disable-pip-version-check -q download --no-deps --only-binary=:all: \
  -d "$tmp/wheels" "${wheels[@]}"
rm -rf "$DEST.new"
"$VENV/bin/python" - "$tmp/wheels" "$DEST.new/include" <<'EOF'
import sys, zipfile
from pathlib import Path

wheels, dest = Path(sys.argv[1]), Path(sys.argv[2])
dest.mkdir(parents=True)
for wheel in sorted(wheels.glob("*.whl")):
    with zipfile.ZipFile(wheel) as z:
        for name in z.namelist():
            parts = name.split("/")
            if "include" in parts[:-1] and parts[-1]:
                rel = parts[parts.index("include") + 1:]
                (dest / Path(*rel)).parent.mkdir(parents=True, exist_ok=True)
                (dest / Path(*rel)).write_bytes(z.read(name))
EOF
printf '%s\n' "$stamp" > "$DEST.new/VERSIONS"
rm -rf "$DEST"
mv "$DEST.new" "$DEST"
echo "cuda_headers: $(find "$DEST/include" -type f | wc -l) headers in $DEST/include"
