#!/usr/bin/env bash
# Create (or reuse) the project's virtual environment and install sglang-ds41 into it.
# Reinstalls only when pyproject.toml, setup.py, constraints/cpu.txt or this script change (a
# stamp records their hash). The environment is the CPU serving one, every package pinned by
# constraints/cpu.txt: the base install, the `serve` and `test` extras, and sglang 0.5.23
# without its CUDA-only dependencies (the same as `pip install 'sglang-ds41[serve]' &&
# pip install --no-deps sglang==0.5.23`, resolved on the day the constraints were written).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
VENV=${VENV:-"$ROOT/.venv"}
PYTHON=${PYTHON:-python3.11}

stamp_of() { cat "$ROOT/pyproject.toml" "$ROOT/setup.py" "$ROOT/constraints/cpu.txt" "$0" | sha256sum | cut -c1-16; }
want=$(stamp_of)
if [[ -x "$VENV/bin/python" && -f "$VENV/.sglang-ds41-stamp" && "$(cat "$VENV/.sglang-ds41-stamp")" == "$want" ]]; then
  exit 0
fi
[[ -x "$VENV/bin/python" ]] || "$PYTHON" -m venv "$VENV"
"$VENV/bin/pip" install --quiet --upgrade pip
"$VENV/bin/pip" install --quiet --no-deps sglang==0.5.23  # its CPU-usable deps: the serve extra
"$VENV/bin/pip" install --quiet -c "$ROOT/constraints/cpu.txt" -e "$ROOT[test,serve]"
echo "$want" > "$VENV/.sglang-ds41-stamp"
echo "setup: environment ready in $VENV" >&2
