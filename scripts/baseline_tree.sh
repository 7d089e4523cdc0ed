#!/usr/bin/env bash
# Export one commit's tree into .baseline/ (git-ignored) for a side-by-side run on the device:
#   bash scripts/baseline_tree.sh e20dedf
#   device call: carry [".whl", ".baseline"], THROUGHPUT_ROOT=.baseline bash scripts/gpu_session.sh throughput
# (bench/throughput.py --kloop-root runs the same batch through that tree first, in a fresh
# process, and prints this checkout's ratio to it.)
set -euo pipefail
cd "$(dirname "$0")/.."
commit=${1:?usage: baseline_tree.sh COMMIT}
grep -qx '/.baseline/' .git/info/exclude 2>/dev/null || echo '/.baseline/' >> .git/info/exclude
rm -rf .baseline
mkdir .baseline
git archive "$commit" | tar -x -C .baseline
git rev-parse --short "$commit" > .baseline/COMMIT
echo ".baseline/ = $(cat .baseline/COMMIT) ($(du -sh .baseline | cut -f1))"
