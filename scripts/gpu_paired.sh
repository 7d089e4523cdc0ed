#!/usr/bin/env bash
# One device call for paired timing: identity (references as candidates at full size, some
# repeated for the CV) and the K10 exploit under both policies. Logs and JSON under $OUT.
set -uo pipefail
OUT=${OUT:-/tmp/kloop-out}; mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade .whl/*.whl || exit 1
site=$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
echo "$PWD" > "$site/kloop-dev.pth"
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,clocks.sm --format=csv > "$OUT/env.txt" 2>&1
for pol in strict kernelbench; do
  timeout 120 python3 -m agent.cli eval tests/exploits/candidates/k10_fp32_probes_low_precision_timed.py \
    --problem L3/4 --policy $pol --json > "$OUT/k10_$pol.json" 2>> "$OUT/k10.err"
  python3 -c "import json,sys; r=json.load(open('$OUT/k10_$pol.json')); print('K10 $pol', r['status'], sorted({v['rule'] for v in r['violations']}), r['precision_calls'])"
done
timeout ${IDENT_LIMIT:-420} python3 bench/identity.py --problems "${IDENT_PROBLEMS}" --repeat "${IDENT_REPEAT:-1}" \
  --concurrency "${IDENT_CONC:-4}" --baselines "${IDENT_BASELINES:-eager}" --json "$OUT/identity.jsonl" 2>"$OUT/identity.err" | tee "$OUT/identity.txt"
tail -5 "$OUT/identity.err"
