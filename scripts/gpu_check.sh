#!/usr/bin/env bash
# The GPU check, in one command, for a machine with one NVIDIA GPU and torch + triton (SGLang
# need not be installed there): benchmarks/gpu_engram.py (kernel correctness on the device,
# MXFP4 vs FP8 lookup time from real-size per-rank tables in device / pinned / registered host
# memory, CUDA-graph capture and replay). Results land in $OUT if set, else benchmarks/results/.
#
#   scripts/gpu_check.sh --stage   # on the machine with .venv, once: copy upstream SGLang's FP8
#                                  # gather kernel (the peer) into .gpu_carry/ (git-ignored)
#   scripts/gpu_check.sh           # on the GPU machine, from a copy of this checkout with
#                                  # .gpu_carry/ in it
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
if [[ "${1:-}" == "--stage" ]]; then
  src=$(ls "${VENV:-$ROOT/.venv}"/lib/python3*/site-packages/sglang/kernels/ops/embeddings/engram_gather.py)
  mkdir -p .gpu_carry && cp "$src" .gpu_carry/engram_gather.py
  echo "staged $src -> .gpu_carry/engram_gather.py"
  exit 0
fi
OUT=${OUT:-$ROOT/benchmarks/results}
mkdir -p "$OUT"
export PYTHONPATH=$ROOT PYTHONUNBUFFERED=1
PY=${PYTHON:-python3}
{ nvidia-smi || true; "$PY" -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"; } \
  2>&1 | tee "$OUT/gpu_env.txt"
upstream=()
[[ -f .gpu_carry/engram_gather.py ]] && upstream=(--upstream-kernel .gpu_carry/engram_gather.py)
"$PY" benchmarks/gpu_engram.py --out "$OUT" "${upstream[@]}" "$@" 2>&1 | tee "$OUT/gpu_engram.txt"
