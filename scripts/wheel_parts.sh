#!/usr/bin/env bash
# A wheel larger than one device call carries (64 MiB with the working tree; Ray's cp312 wheel is
# about 79 MB) travels in two parts over two calls of one warm machine: the first call leaves its
# part in an ignored folder there, which the machine keeps for the next call.
#   bash scripts/wheel_parts.sh split WHEEL DIR_A DIR_B   # here: WHEEL.part-a in A; .part-b and .sha256 in B
#   bash scripts/wheel_parts.sh join DIR_A DIR_B OUT_DIR  # there: OUT_DIR/WHEEL, its sha256 checked
# PART_BYTES (default 40000000) is the size of the first part.
set -euo pipefail
cmd=${1:-}
case $cmd in
  split)
    wheel=$2 a=$3 b=$4
    name=$(basename "$wheel")
    mkdir -p "$a" "$b"
    head -c "${PART_BYTES:-40000000}" "$wheel" > "$a/$name.part-a"
    tail -c +"$(( ${PART_BYTES:-40000000} + 1 ))" "$wheel" > "$b/$name.part-b"
    (cd "$(dirname "$wheel")" && sha256sum "$name") > "$b/$name.sha256"
    ls -l "$a/$name.part-a" "$b/$name.part-b"
    ;;
  join)
    a=$2 b=$3 out=$4
    sums=("$b"/*.sha256)
    [ ${#sums[@]} -eq 1 ] && [ -f "${sums[0]}" ] || { echo "join: expected one .sha256 in $b" >&2; exit 1; }
    sumfile=$(realpath "${sums[0]}")
    name=$(basename "$sumfile" .sha256)
    [ -f "$a/$name.part-a" ] || { echo "join: $a/$name.part-a is missing (did the first call run on this machine?)" >&2; exit 1; }
    mkdir -p "$out"
    cat "$a/$name.part-a" "$b/$name.part-b" > "$out/$name"
    (cd "$out" && sha256sum --check --quiet "$sumfile") || { rm -f "$out/$name"; echo "join: $name does not match its sha256" >&2; exit 1; }
    echo "$out/$name"
    ;;
  *) echo "usage: wheel_parts.sh split WHEEL DIR_A DIR_B | join DIR_A DIR_B OUT_DIR" >&2; exit 2 ;;
esac
