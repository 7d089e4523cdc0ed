#!/usr/bin/env bash
# Parts of the figure of record at once on a multi-GPU host, one part per GPU: each part is the
# process `gpu_session.sh experiment` runs on a one-GPU machine (its own fresh --cache, its
# first use on its own clock, the same concurrency), with one GPU visible. The host's temp dir
# stays shared: the sandbox uid leases in it keep every part's candidates apart, as on any host
# running several kloop processes. Each part says so in its figures (`--host-parts`).
#   EXPERIMENT_PARTS="1/9 2/9 3/9" bash scripts/parts_on_gpus.sh
# Writes $OUT/experiment-KofN.{json,log} and $OUT/rows-KofN.jsonl. Exits non-zero if any part did.
set -uo pipefail
OUT=${OUT:?set OUT}
read -r -a parts <<< "${EXPERIMENT_PARTS:?EXPERIMENT_PARTS=\"K/N K/N ...\"}"
gpus=${PARTS_GPUS:-$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ')}
if (( ${#parts[@]} > gpus )); then
  echo "${#parts[@]} parts for $gpus GPUs: one part per GPU" >&2
  exit 2
fi
pids=()
for i in "${!parts[@]}"; do
  tag=${parts[$i]/\//of}
  cache=.bench-parts/$tag
  rm -rf "$cache"
  # shellcheck disable=SC2086  # EXPERIMENT_ARGS is a list of flags
  CUDA_VISIBLE_DEVICES=$i ${PARTS_PYTHON:-python3} bench/experiment.py \
    --concurrency "${EXPERIMENT_CONCURRENCY:-8}" --part "${parts[$i]}" --cache "$cache" \
    --host-parts "${#parts[@]}" --rows "$OUT/rows-$tag.jsonl" --json "$OUT/experiment-$tag.json" \
    ${EXPERIMENT_ARGS:---steady} > "$OUT/experiment-$tag.log" 2>&1 &
  pids+=($!)
done
rc=0
for i in "${!pids[@]}"; do
  wait "${pids[$i]}"
  code=$?
  echo "part ${parts[$i]} rc=$code"
  (( code == 0 )) || rc=1
done
exit $rc
