#!/usr/bin/env bash
# Create .venv and install kloop with its test tools. Idempotent: a second run only re-installs kloop.
#
# torch: an existing torch in the venv is kept (a user's CUDA build is never replaced). Otherwise,
# on a machine with no NVIDIA GPU we install the CPU build torch==2.13.0 and never a multi-GB CUDA
# build; with a GPU, the default PyPI build. Set TORCH_SPEC / TORCH_PIP_ARGS to choose yourself
# (e.g. TORCH_PIP_ARGS="--index-url https://download.pytorch.org/whl/cpu" where that index is reachable).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
VENV=${VENV:-.venv}

[ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
PIP=("$VENV/bin/python" -m pip --disable-pip-version-check -q)
"${PIP[@]}" install -U pip >/dev/null

if ! "$VENV/bin/python" -c "import torch" 2>/dev/null; then
  if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
    default_torch="torch>=2.4"
  else
    default_torch="torch==2.13.0"
  fi
  # shellcheck disable=SC2086
  "${PIP[@]}" install "${TORCH_SPEC:-$default_torch}" ${TORCH_PIP_ARGS:-}
fi
# torch 2.13's CUDA wheels pin triton 3.7.1: use the same version on CPU so CI compiles what GPUs run.
if ! "$VENV/bin/python" -c "import triton" 2>/dev/null; then
  "${PIP[@]}" install "triton==3.7.1"
fi
"${PIP[@]}" install -e ".[dev]"
VENV="$VENV" bash scripts/cuda_headers.sh
echo "kloop installed in $VENV ($("$VENV/bin/python" -c 'import torch; print("torch", torch.__version__)'))"
