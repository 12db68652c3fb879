#!/usr/bin/env bash
# Create (or reuse) the GPU serving environment: sglang 0.5.23 with its whole CUDA stack, torch
# 2.14.1 and sglang-ds41 (whose SGLang plugin gives upstream's V4.1 model the MXFP4 Engram tables),
# every package pinned by constraints/gpu-cu13.txt. Needs CPython 3.11 on linux x86_64 and an
# NVIDIA driver for CUDA 13; downloads ~10 GB. Then `python -m sglang.launch_server ...` (README,
# "Serving the real model on 4 GPUs").
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
VENV=${VENV:-"$ROOT/.venv-gpu"}
PYTHON=${PYTHON:-python3.11}
[[ -x "$VENV/bin/python" ]] || "$PYTHON" -m venv "$VENV"
"$VENV/bin/pip" install --quiet --upgrade pip
"$VENV/bin/pip" install -c "$ROOT/constraints/gpu-cu13.txt" -e "$ROOT[gpu]"
"$VENV/bin/python" - <<'PY'
from importlib.metadata import entry_points, version

assert version("sglang") == "0.5.23", version("sglang")
names = {ep.name for ep in entry_points(group="sglang.srt.plugins")}
assert "sglang_ds41" in names, f"the sglang-ds41 plugin is not registered: {sorted(names)}"
print(f"setup-gpu: sglang {version('sglang')}, torch {version('torch')}, plugin registered")
PY
echo "setup-gpu: environment ready in $VENV (source $VENV/bin/activate)" >&2
