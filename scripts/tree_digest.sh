#!/usr/bin/env bash
# A digest of the code a device call runs: the device machine's copy of the repo carries a
# stale .git, so its commit cannot be read there. Run it in both places: equal digests tie a GPU
# run to the commit whose tree gives the same one here (`bash scripts/tree_digest.sh`). Files
# .gitignore leaves out are left out (the device copy does not carry them); the index is not
# read (the device's is stale).
set -euo pipefail
cd "$(dirname "$0")/.."
paths=()
for p in agent evaluator problems prompts bench scripts tests kloop pyproject.toml; do
  [ -e "$p" ] && paths+=("$p")
done
all=$(find "${paths[@]}" -type f -not -path '*/__pycache__/*' | LC_ALL=C sort)
ignored=$(printf '%s\n' "$all" | git check-ignore --no-index --stdin 2>/dev/null | LC_ALL=C sort || true)
LC_ALL=C comm -23 <(printf '%s\n' "$all") <(printf '%s\n' "$ignored") \
  | xargs -d '\n' sha256sum | sha256sum | cut -c1-16
