#!/usr/bin/env bash
# Run on the GPU machine (the device tool), from the repo root, with .whl carried:
#   bash scripts/gpu_run.sh [pytest args...]
# Installs the carried cp312 wheels into /tmp/site, puts kloop on PYTHONPATH, prints the
# environment, runs the `gpu`-marked tests, and writes logs under $OUT (when set).
set -uo pipefail
OUT=${OUT:-/tmp/kloop-out}
mkdir -p "$OUT"
# Into the interpreter's own site-packages (not --target + PYTHONPATH): the evaluator starts its
# candidate and reference processes with a scrubbed environment, and they must import these too.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade .whl/*.whl || exit 1
site=$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
echo "$PWD" > "$site/kloop-dev.pth"
export PYTHONUNBUFFERED=1
python3 - <<'PY' | tee "$OUT/env.txt"
import platform, subprocess, torch, triton
print("python", platform.python_version(), "torch", torch.__version__, "cuda", torch.version.cuda,
      "triton", triton.__version__)
print("device", torch.cuda.get_device_name(0), torch.cuda.get_device_capability(0))
print(subprocess.run(["nvidia-smi", "--query-gpu=driver_version,clocks.sm,clocks.mem", "--format=csv"],
                     capture_output=True, text=True).stdout)
PY
# No commit here: the device's copy of .git can be stale. The tree's digest ties the run to the
# commit whose `bash scripts/tree_digest.sh` prints the same.
echo "tree $(bash scripts/tree_digest.sh)" | tee -a "$OUT/env.txt"
# Every exploit-suite evaluation appends its verdict-table row here (tests/exploits).
export KLOOP_VERDICT_LOG="$OUT/verdicts.jsonl"
# GPU_RUN_LIMIT (seconds): stop pytest before the device call's own limit, so logs come back.
timeout --signal=INT --kill-after=20 "${GPU_RUN_LIMIT:-100000}" \
  python3 -m pytest -m gpu -q -rA -p no:cacheprovider --junitxml="$OUT/gpu-junit.xml" "$@" 2>&1 \
  | tee "$OUT/gpu-tests.log" | tail -80
rc=${PIPESTATUS[0]}
if [ -s "$KLOOP_VERDICT_LOG" ]; then
  python3 tests/exploits/verdict_table.py --from "$KLOOP_VERDICT_LOG" --device gpu \
    > "$OUT/verdict_table.md"
fi
exit "$rc"
