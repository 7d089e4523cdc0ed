#!/usr/bin/env bash
# The paired-timing device call: K10 under both policies, then identity steps (references as
# candidates at full size). Each IDENT_<n> variable is one step: "PROBLEMS|BASELINES|ENV", e.g.
#   IDENT_1="L3/4,L3/4|eager|" IDENT_2="L3/4,L3/4|eager|KLOOP_QUIET_CORES=off" bash scripts/gpu_paired.sh
# Logs and JSON lines under $OUT (identity_<n>.jsonl); STEP_LIMIT (s) bounds each step.
set -uo pipefail
OUT=${OUT:-/tmp/kloop-out}; mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade .whl/*.whl || exit 1
site=$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
echo "$PWD" > "$site/kloop-dev.pth"
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,clocks.sm --format=csv > "$OUT/env.txt" 2>&1
if [ -n "${K10:-}" ]; then
  for pol in strict kernelbench; do
    timeout 120 python3 -m kloop.agent.cli eval tests/exploits/candidates/k10_fp32_probes_low_precision_timed.py \
      --problem L3/4 --policy $pol --json > "$OUT/k10_$pol.json" 2>> "$OUT/k10.err"
    python3 -c "import json; r=json.load(open('$OUT/k10_$pol.json')); print('K10 $pol', r['status'], sorted({v['rule'] for v in r['violations']}), r['precision_calls'])"
  done
fi
for n in 1 2 3 4 5 6; do
  var="IDENT_$n"; spec=${!var:-}; [ -z "$spec" ] && continue
  IFS='|' read -r problems baselines envs <<<"$spec"
  echo "== step $n: $problems baselines=$baselines $envs"
  env $envs timeout "${STEP_LIMIT:-300}" python3 bench/identity.py --problems "$problems" \
    --concurrency "${IDENT_CONC:-4}" --baselines "$baselines" --json "$OUT/identity_$n.jsonl" \
    2>"$OUT/identity_$n.err" | tee "$OUT/identity_$n.txt" | cut -c1-170
  tail -2 "$OUT/identity_$n.err"
done
if [ -n "${KB_PROBLEMS:-}" ]; then  # KernelBench's own eval beside kloop (.kb carried)
  echo "== KernelBench agreement: $KB_PROBLEMS"
  timeout "${KB_LIMIT:-300}" python3 bench/kb_agreement.py --kb .kb --problems "$KB_PROBLEMS" \
    --json "$OUT/kb.jsonl" 2>"$OUT/kb.err"
  tail -3 "$OUT/kb.err"
fi
[ -n "${PYTEST_ARGS:-}" ] && timeout "${PYTEST_LIMIT:-300}" python3 -m pytest $PYTEST_ARGS \
  ${PYTEST_K:+-k "$PYTEST_K"} > "$OUT/pytest.log" 2>&1; tail -15 "$OUT/pytest.log" 2>/dev/null
cd "$OUT" && tar czf all.tgz --exclude=all.tgz . && rm -f ./*.err ./*.txt ./*.log ./*.json
exit 0
