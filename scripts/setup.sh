#!/usr/bin/env bash
# Create (or reuse) the project's virtual environment and install sglang-ds41 into it.
# Reinstalls only when pyproject.toml, setup.py or this script change (a stamp records their hash).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
VENV=${VENV:-"$ROOT/.venv"}
PYTHON=${PYTHON:-python3.11}

stamp_of() { cat "$ROOT/pyproject.toml" "$ROOT/setup.py" "$0" | sha256sum | cut -c1-16; }
want=$(stamp_of)
if [[ -x "$VENV/bin/python" && -f "$VENV/.sglang-ds41-stamp" && "$(cat "$VENV/.sglang-ds41-stamp")" == "$want" ]]; then
  exit 0
fi
[[ -x "$VENV/bin/python" ]] || "$PYTHON" -m venv "$VENV"
"$VENV/bin/pip" install --quiet --upgrade pip
"$VENV/bin/pip" install --quiet --no-deps sglang==0.5.23  # its deps: the serve extra
"$VENV/bin/pip" install --quiet -e "$ROOT[test,serve]"
echo "$want" > "$VENV/.sglang-ds41-stamp"
echo "setup: environment ready in $VENV" >&2
