#!/usr/bin/env bash
# One device call, many steps: installs the carried wheels once, then runs the named steps in
# order, each under its own time limit, each logging to $OUT/<step>.log, so that a step that runs
# long costs only itself and every finished step's output comes back.
#   bash scripts/gpu_session.sh template handshake diag clock record
# Steps: see the case below. STEP_LIMIT_<step> (seconds) overrides a step's limit. At the end
# everything in $OUT is also packed into $OUT/all.tgz (a call brings back 8 files at most).
set -uo pipefail
export OUT=${OUT:-/tmp/kloop-out}
mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade .whl/*.whl || exit 1
site=$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
echo "$PWD" > "$site/kloop-dev.pth"
export PYTHONUNBUFFERED=1 KLOOP_VERDICT_LOG="$OUT/verdicts.jsonl"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv > "$OUT/env.txt" 2>&1
# The device's .git can be stale: this digest ties the call to the commit that gives the same
# one here (`bash scripts/tree_digest.sh`).
echo "tree $(bash scripts/tree_digest.sh)" | tee -a "$OUT/env.txt"

step() {  # step NAME DEFAULT_LIMIT COMMAND...
  local name=$1 limit=$2; shift 2
  local var="STEP_LIMIT_${name//-/_}"
  limit=${!var:-$limit}
  local t0=$SECONDS
  timeout --signal=INT --kill-after=15 "$limit" "$@" > "$OUT/$name.log" 2>&1
  local rc=$?
  echo "$name rc=$rc ${limit}s-limit took=$((SECONDS - t0))s" | tee -a "$OUT/steps.txt"
}

for s in "$@"; do
  case $s in
    template) step template 150 python3 -m pytest -m gpu -q -rA -p no:cacheprovider \
                tests/evaluator/test_template_process.py ;;
    handshake) step handshake 120 python3 bench/handshake.py --sizes 16K,8M --gap-ms 5 ;;
    handshake-nobusy) step handshake-nobusy 120 python3 bench/handshake.py --sizes 16K,8M \
                --gap-ms 5 --busy-cycles 0 ;;
    diag) step diag 150 python3 bench/diag_process.py ;;
    timeslice) step timeslice 90 python3 bench/diag_timeslice.py ;;  # what the quiet check sees
    diag-uid) step diag-uid 150 python3 bench/diag_uid.py ;;
    diag-trials) step diag-trials 300 python3 bench/diag_trials.py ;;
    # Where a custom-kernel candidate's probe trials go (each trial timed and profiled).
    # The same trials as a lock holder runs them (moved onto the serving cores): torch's default
    # thread count, then one thread per serving core (what a lock holder gets now).
    diag-pin) step diag-pin 240 bash -c 'python3 bench/diag_ghost.py --problems "${DIAG_PROBLEMS:-L3/18}" \
                --kinds "${DIAG_KINDS:-triton,cuda_lean}" --pin --out "$OUT/diag-pin.jsonl" &&
              python3 bench/diag_ghost.py --problems "${DIAG_PROBLEMS:-L3/18}" \
                --kinds "${DIAG_KINDS:-triton,cuda_lean}" --pin --threads 2 --out "$OUT/diag-pin.jsonl"' ;;
    diag-ghost) step diag-ghost 300 python3 bench/diag_ghost.py --problems "${DIAG_PROBLEMS:-L3/1,L3/18,L3/35}" \
                  --kinds "${DIAG_KINDS:-reference,triton,cuda_lean}" --out "$OUT/diag-ghost.jsonl" ;;
    diag-threads) step diag-threads 300 python3 bench/diag_threads.py \
                --only "${DIAG_ONLY:-L3/1-b8,L3/1-b1024,L3/4}" --repeats "${DIAG_REPEATS:-1}" ;;
    # Where a reference worker's shared hold goes, piece by piece, alone (bench/diag_reference.py).
    diag-reference) step diag-reference 120 python3 bench/diag_reference.py \
                      --only "${DIAG_PROBLEMS:-L3/1,L3/18,L3/35,L3/31,L3/13}" --json "$OUT/diag-reference.json" ;;
    first-trial) step first-trial 90 python3 bench/first_trial.py --repeats "${DIAG_REPEATS:-1}" ;;
    cupti) step cupti 120 python3 bench/cupti.py ;;
    kb) step kb 240 python3 bench/clock.py --kb --repeats "${KB_REPEATS:-3}" --only "${KB_ONLY:-L3/1,L3/4}" ;;
    clock) step clock 300 python3 bench/clock.py ${CLOCK_QUICK:+--quick} --only "${CLOCK_ONLY:-L3/1-b8,L3/1-b1024,L3/1,L3/4}" ;;
    # Tests that need no GPU, run on the GPU host: a real pool uid and root harness there.
    host) step host 120 python3 -m pytest -q -rA -p no:cacheprovider ${HOST_TESTS:-tests/evaluator/test_namespaces.py tests/evaluator/test_pinned_outputs.py} \
              ${HOST_K:+-k "$HOST_K"} ;;  # HOST_TESTS is split by the shell: a -k goes in HOST_K
    record) step record 420 python3 -m kloop.agent.demo.examples record --device cuda \
              --concurrency "${RECORD_CONCURRENCY:-4}"
            tar czf "$OUT/examples.tgz" runs/examples/suite-* agent/demo/suite ;;  # one file back
    # The figure of record (bench/experiment.py): EXPERIMENT_PART=K/N, each part on a cache of its
    # own (.bench-experiment-KofN, an ignored folder the machine keeps between calls, so a
    # part's `--steady-only` call finds its first pass's cache and another part on the same
    # machine starts on an empty one); rows and figures come back.
    experiment) step experiment 560 python3 bench/experiment.py --concurrency "${EXPERIMENT_CONCURRENCY:-8}" \
                  ${EXPERIMENT_PART:+--part "$EXPERIMENT_PART"} \
                  --cache ".bench-experiment${EXPERIMENT_PART:+-${EXPERIMENT_PART/\//of}}" \
                  --rows "$OUT/experiment-rows.jsonl" --json "$OUT/experiment.json" ${EXPERIMENT_ARGS:-} ;;
    # Parts of the figure of record at once on a multi-GPU machine, one per GPU, each with a
    # fresh cache of its own (scripts/parts_on_gpus.sh): EXPERIMENT_PARTS="1/9 2/9 ...".
    experiment-gpus) step experiment-gpus 560 bash scripts/parts_on_gpus.sh ;;
    # The old path's ratio: a subset judged through 69bdd97's evaluator and then through this
    # checkout, each in a fresh process on a fresh cache, first use included. Carry .old-path
    # (`git worktree add .old-path 69bdd97` here; 2.6 MB).
    old-path) step old-path 500 python3 bench/experiment.py --old-root .old-path \
                --problems "${OLD_PROBLEMS:-L3/1,L3/18,L3/35}" --concurrency "${EXPERIMENT_CONCURRENCY:-8}" \
                --json "$OUT/old-path.json" ;;
    # Where a candidate's lock hold goes (stage_seconds timing_warmup/_rounds/_calls), one at a
    # time on a fresh cache: the 92b4b81 diagnostic, to compare after a change.
    breakdown) step breakdown 420 python3 bench/experiment.py --concurrency 1 --no-warm-up \
                 --problems "${BREAKDOWN_PROBLEMS:-L3/1,L3/11,L3/21}" --kinds reference,cuda_lean \
                 --rows "$OUT/breakdown-rows.jsonl" --json "$OUT/breakdown.json" ;;
    # Kept baseline workers against each evaluation's own, side by side on one cache: `kept`
    # (fresh cache, then the same batch again with fresh builds) and then `own` (the old path,
    # on the cache `kept` warmed); compare the lock holds of warm candidates.
    kept) step kept 420 python3 bench/experiment.py --concurrency 1 --no-warm-up \
            --problems "${KEPT_PROBLEMS:-L3/1,L3/21}" --kinds reference,cuda_lean \
            --cache .bench-kept --steady --rows "$OUT/kept-rows.jsonl" --json "$OUT/kept.json" ;;
    own) step own 240 python3 bench/experiment.py --concurrency 1 --no-warm-up \
           --problems "${KEPT_PROBLEMS:-L3/1,L3/21}" --kinds reference,cuda_lean \
           --cache .bench-kept --kept-baselines 0 --rows "$OUT/own-rows.jsonl" --json "$OUT/own.json" ;;
    repeat) step repeat 560 python3 bench/repeat.py --repeats "${REPEATS:-5}" --json "$OUT/repeat.json" \
              ${REPEAT_ARGS:-} ;;
    throughput) step throughput 560 python3 bench/throughput.py \
                --concurrency "${THROUGHPUT_CONCURRENCY:-4}" --rows "$OUT/throughput-rows.jsonl" \
                --json "$OUT/throughput.json" ${THROUGHPUT_ROOT:+--kloop-root "$THROUGHPUT_ROOT"} \
                ${THROUGHPUT_ARGS:-} ;;
    # Baselines of every problem of the throughput batch, kept in an ignored dir that the
    # machine keeps between calls while warm: the next call's `throughput` step passes
    # THROUGHPUT_ARGS="--warm-baselines --baselines-cache .bench-warm" and times the batch.
    warm) step warm 400 python3 bench/throughput.py --concurrency "${THROUGHPUT_CONCURRENCY:-4}" \
            --warm-baselines --baselines-cache .bench-warm --warm-only ${WARM_ARGS:-} ;;
    template-bench) step template-bench 150 python3 bench/template.py --device cuda ;;
    pch) step pch 300 python3 bench/pch.py ;;
    lean) step lean 150 python3 bench/lean_prologue.py ;;  # the way to a 15 s CUDA build
    torchform) step torchform 300 python3 bench/torch_form.py --pch "$OUT/.pch-torchform" \
                 --sources "${TORCHFORM_SOURCES:-mlp_cuda_relu.py,attention_cuda.py,resnet_block_bn_relu_cuda.py}" \
                 --json "$OUT/torchform.json"; rm -rf "$OUT/.pch-torchform" ;;
    stages) step stages 300 python3 bench/evaluator.py --only stages --json "$OUT/stages.json" \
              ${STAGES_PROBLEMS:+--problems "$STAGES_PROBLEMS"} ;;
    cv) step cv 150 python3 bench/evaluator.py --only cv --repeats "${CV_REPEATS:-6}" \
        --cv-set "${CV_SET:-mlp-b1024}" --json "$OUT/cv.json" ;;
    builds) step builds 300 python3 bench/evaluator.py --only compile \
              ${BUILD_PAIRS:+--compile-pairs} ${BUILD_SOURCES:+--sources "$BUILD_SOURCES"} \
              ${BUILD_AT_ONCE:+--compile-at-once "$BUILD_AT_ONCE"} --headers "${BUILD_HEADERS:-as-is}" \
              ${BUILD_PLAIN:+--plain-cuda} --json "$OUT/builds.json" ;;
    # The throughput targets (bench/acceptance.py) against the figures the throughput, builds and stages steps wrote.
    acceptance) step acceptance 30 python3 bench/acceptance.py --throughput "$OUT/throughput.json" \
                  --evaluator "$OUT/builds.json" --evaluator "$OUT/stages.json"
                cat "$OUT/acceptance.log" ;;
    # Tests that assert on measured times run after the rest, one at a time (`alone`).
    evaluator) step evaluator 540 python3 -m pytest -m "gpu and not alone" -q -rA \
                -p no:cacheprovider -n 4 tests/evaluator ${EVALUATOR_K:+-k "$EVALUATOR_K"} ;;
    # Tree, beam and sequential at a matched budget on L3/4, reported with every baseline and
    # the speed-of-light bound (agent/demo/search_gpu.yaml); the run dirs come back packed.
    search) step search 300 bash -c 'rm -rf runs/search-gpu && python3 -m kloop run -c agent/demo/search_gpu.yaml && python3 -m kloop report runs/search-gpu --bootstrap 200'
            tar czf "$OUT/search.tgz" runs/search-gpu ;;
    # Ray in two calls of one warm machine (scripts/ray_wheels.sh made .ray-a and .ray-b here):
    # the first call keeps its part in .ray-stage, which no call carries, so the machine keeps it.
    ray-stash) mkdir -p .ray-stage && cp .ray-a/*.part-a .ray-stage/ && ls -l .ray-stage | tee "$OUT/ray-stash.log" ;;
    ray-install) step ray-install 120 bash -c 'set -e; w=$(bash scripts/wheel_parts.sh join .ray-stage .ray-b /tmp/ray-whl)
                   python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir "$w" .ray-b/*.whl
                   python3 -c "import ray; print(\"ray\", ray.__version__)"' ;;
    # What the ray executor adds per candidate beside the local executor, and where Ray placed
    # its worker (its CUDA_VISIBLE_DEVICES and GPU).
    ray) step ray 400 python3 bench/ray_overhead.py --device cuda --rounds "${RAY_ROUNDS:-4}" ;;
    # The ray executor's worker class on the GPU, without Ray.
    agent) step agent 150 python3 -m pytest -m gpu -q -rA -p no:cacheprovider tests/agent ;;
    alone) step alone 240 python3 -m pytest -m "gpu and alone" -q -rA -p no:cacheprovider \
                tests ${EVALUATOR_K:+-k "$EVALUATOR_K"} ;;
    exploits) step exploits 540 python3 -m pytest -m gpu -q -rA -p no:cacheprovider -n "${EXPLOITS_N:-8}" \
                tests/exploits ${EXPLOITS_K:+-k "$EXPLOITS_K"} ;;
    *) echo "unknown step $s" | tee -a "$OUT/steps.txt" ;;
  esac
done
# Only 8 files come back from a device call: everything, packed, is one of them.
tar czf /tmp/kloop-all.tgz -C "$OUT" . 2>/dev/null && mv /tmp/kloop-all.tgz "$OUT/all.tgz"
