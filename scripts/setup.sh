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
# pip would print every dependency sglang went in without as an ERROR line (~40 of them, read as
# a failed install); `pip check` below says that in one line and shows any other problem in full.
# (setuptools' note on editable installs is the package-dir mapping README's Layout explains.)
PYTHONWARNINGS="ignore:Editable installation" \
  "$VENV/bin/pip" install --quiet --no-warn-conflicts -c "$ROOT/constraints/cpu.txt" -e "$ROOT[test,serve]"
missing='^sglang 0\.5\.23 requires [^,]*, which is not installed\.$'
problems=$("$VENV/bin/pip" check 2>&1 || true)
left_out=$(grep -c "$missing" <<<"$problems" || true)
if (( left_out > 0 )); then
  echo "setup: sglang 0.5.23 is installed without $left_out of its dependencies, on purpose: CUDA kernels" \
    "(flashinfer, sglang-kernel, DeepGEMM, ...) and extras the CPU backend never imports ('pip check' lists them)" >&2
fi
if grep -v -e "$missing" -e '^No broken requirements found\.$' <<<"$problems" >&2; then
  echo "setup: 'pip check' found the problems above besides those" >&2
fi
echo "$want" > "$VENV/.sglang-ds41-stamp"
echo "setup: environment ready in $VENV" >&2
