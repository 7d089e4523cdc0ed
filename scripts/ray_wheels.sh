#!/usr/bin/env bash
# Ray for the GPU machine, which lacks it: its cp312 wheel (about 79 MB) is larger than one device
# call carries, so it is split in two (scripts/wheel_parts.sh): .ray-a/ holds the first part,
# .ray-b/ the second, its sha256 and the small wheels Ray needs that the machine lacks (jsonschema
# and its three; KINDS.md lists the rest as there). Run once here; then, on one warm machine:
#   call 1, carry [".whl", ".ray-a"]:  bash scripts/gpu_session.sh ray-stash
#   call 2, carry [".whl", ".ray-b"]:  bash scripts/gpu_session.sh ray-install ray
set -euo pipefail
cd "$(dirname "$0")/.."
RAY_VERSION=${RAY_VERSION:-2.60.0}
dl=$(mktemp -d)
trap 'rm -rf "$dl"' EXIT
plat=()
for p in manylinux_2_28_x86_64 manylinux_2_27_x86_64 manylinux_2_17_x86_64 manylinux2014_x86_64 manylinux1_x86_64; do
  plat+=(--platform "$p")
done
get() { python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
          --implementation cp "${plat[@]}" -d "$1" "$2"; }
get "$dl" "ray==$RAY_VERSION"
rm -rf .ray-a .ray-b
bash scripts/wheel_parts.sh split "$dl"/ray-*.whl .ray-a .ray-b
for spec in jsonschema jsonschema-specifications referencing rpds-py; do
  get .ray-b "$spec"
done
du -sh .ray-a .ray-b
