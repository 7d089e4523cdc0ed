#!/usr/bin/env bash
# Download, into .whl/, the cp312 wheels that the GPU machine lacks (it has torch, triton, numpy,
# jinja2, pytest, typer, rich, pyyaml, matplotlib, einops, but no pydantic, tenacity or the SDKs).
# Run once here; then every device call carries .whl and runs scripts/gpu_run.sh (or its install line) first.
set -euo pipefail
cd "$(dirname "$0")/.."
grep -qx '/.whl/' .git/info/exclude 2>/dev/null || echo '/.whl/' >> .git/info/exclude
mkdir -p .whl
plat=()
for p in manylinux_2_28_x86_64 manylinux_2_27_x86_64 manylinux_2_17_x86_64 manylinux2014_x86_64 manylinux1_x86_64; do
  plat+=(--platform "$p")
done
for spec in "pydantic==2.14.4" "pydantic-core==2.50.5" "annotated-types==0.8.0" \
            "typing-inspection==0.4.5" "tenacity==9.2.1"; do
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
    --implementation cp "${plat[@]}" -d .whl "$spec"
done
ls .whl
