#!/usr/bin/env bash
# Set everything up, lint, and run the test suite (the fast CI subset; `--slow` adds long runs).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
VENV=${VENV:-"$ROOT/.venv"}
"$ROOT/scripts/setup.sh"
cd "$ROOT"
"$VENV/bin/ruff" check .
marker=(-m "not slow")
if [[ "${1:-}" == "--slow" ]]; then marker=(); shift; fi
exec "$VENV/bin/python" -m pytest "${marker[@]}" "$@"
