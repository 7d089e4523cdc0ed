#!/usr/bin/env bash
# Create .venv and install kloop with its test tools. Idempotent: a second run only re-installs kloop.
#
# torch, on each kind of machine (an existing torch in the venv is always kept, so a user's CUDA
# build is never replaced):
#   - NVIDIA GPU (nvidia-smi lists one): torch>=2.4 from your pip sources (PyPI: the CUDA build).
#   - no GPU, PyTorch's CPU index reachable: torch==2.13.0 from https://download.pytorch.org/whl/cpu
#     (about 200 MB; never the multi-GB CUDA build and its NVIDIA packages).
#   - no GPU, that index unreachable: torch==2.13.0+cpu from your own pip sources (a wheel folder or
#     mirror); if they have none, setup stops and says what to run. It never falls back to PyPI's
#     default torch, which is the CUDA build.
# TORCH_SPEC / TORCH_PIP_ARGS choose for yourself; KLOOP_SETUP_DRY_RUN=1 prints the torch plan only.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
VENV=${VENV:-.venv}
CPU_INDEX=${TORCH_CPU_INDEX:-https://download.pytorch.org/whl/cpu}
TORCH_VERSION=2.13.0

reachable() {  # a short probe, so an offline machine does not wait out pip's own retries
  "$PY" - "$1" <<'PY' >/dev/null 2>&1
import sys, urllib.request
urllib.request.urlopen(sys.argv[1].rstrip("/") + "/torch/", timeout=10)
PY
}

torch_plan() {  # prints: <how> <pip arguments...>
  if [ -n "${TORCH_SPEC:-}${TORCH_PIP_ARGS:-}" ]; then
    echo "yours ${TORCH_SPEC:-torch} ${TORCH_PIP_ARGS:-}"
  elif command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
    echo "gpu torch>=2.4"
  elif reachable "$CPU_INDEX"; then
    echo "cpu-index torch==$TORCH_VERSION --index-url $CPU_INDEX"
  else
    echo "cpu-local torch==$TORCH_VERSION+cpu"
  fi
}

if [ -n "${KLOOP_SETUP_DRY_RUN:-}" ]; then
  echo "torch: $(torch_plan)"
  exit 0
fi

[ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
PIP=("$VENV/bin/python" -m pip --disable-pip-version-check -q)
"${PIP[@]}" install -U pip >/dev/null

if ! "$VENV/bin/python" -c "import torch" 2>/dev/null; then
  read -r how args <<<"$(torch_plan)"
  echo "installing torch ($how): pip install $args"
  # shellcheck disable=SC2086
  if ! "${PIP[@]}" install $args; then
    if [ "$how" = cpu-local ]; then
      echo "setup: no GPU here, $CPU_INDEX could not be reached, and your pip sources have no" >&2
      echo "setup: CPU build of torch $TORCH_VERSION. Install one yourself, e.g." >&2
      echo "setup:   $VENV/bin/pip install torch --index-url <a mirror of $CPU_INDEX>" >&2
      echo "setup: (or TORCH_SPEC=... TORCH_PIP_ARGS=... make setup), then run make again." >&2
    fi
    exit 1
  fi
fi
# torch 2.13's CUDA wheels pin triton 3.7.1: use the same version on CPU so CI compiles what GPUs run.
if ! "$VENV/bin/python" -c "import triton" 2>/dev/null; then
  "${PIP[@]}" install "triton==3.7.1"
fi
# The ray and rl extras too: CI runs the multi-node executor tests on a local Ray cluster, and
# the RL environment's tests (gymnasium).
"${PIP[@]}" install -e ".[dev,ray,rl]"
VENV="$VENV" bash scripts/cuda_headers.sh
echo "kloop installed in $VENV ($("$VENV/bin/python" -c 'import torch; print("torch", torch.__version__)'))"
