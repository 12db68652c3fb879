#!/usr/bin/env bash
# The main job on the embedded default: the tiny DeepSeek-V4.1 checkpoint (official layout and
# formats, real tokenizer) served by a real SGLang server on this machine's CPU, checked token
# for token against the pure-PyTorch reference; then a tool-calling agent run against a real
# SGLang server whose test model plays a scripted weather/calculator conversation.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
VENV=${VENV:-"$ROOT/.venv"}
"$ROOT/scripts/setup.sh"
cd "$ROOT"
PY="$VENV/bin/python"
ds41() { "$VENV/bin/sglang-ds41" "$@"; }

echo "== 1. the V4.1 prompt format: a two-image request -> prompt and ids; a completion -> message"
ds41 render examples/example_harmony.json; echo
ds41 render examples/example_harmony.json --tokens; echo
ds41 parse examples/weather_completion.txt --thinking --tools --seed 0

echo; echo "== 2. the tiny V4.1 checkpoint served by SGLang on CPU (float64, for the exactness check)"
MODEL_DIR=$("$PY" -c "from sglang_ds41.backend.serve import tiny_checkpoint; print(tiny_checkpoint())")
ds41 inspect "$MODEL_DIR" | sed -n 1,12p
PORT=$("$PY" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
LOG=$(mktemp -t sglang-ds41-tiny-XXXXXX.log)
# Started directly (not through the ds41 shell function) so that $! is the server's own PID.
SGLANG_DS41_DTYPE=float64 "$VENV/bin/sglang-ds41" serve "$MODEL_DIR" --port "$PORT" >"$LOG" 2>&1 &
SERVER=$!
stop() { kill -TERM "$SERVER" 2>/dev/null || true; wait "$SERVER" 2>/dev/null || true; rm -f "$LOG"; }
trap stop EXIT
until curl -sf -o /dev/null "http://127.0.0.1:$PORT/health_generate"; do
  kill -0 "$SERVER" 2>/dev/null || { tail -n 40 "$LOG"; exit 1; }
  sleep 2
done
echo "server ready on http://127.0.0.1:$PORT"
"$PY" examples/chat_tiny_server.py --base-url "http://127.0.0.1:$PORT" --model-dir "$MODEL_DIR"
stop; trap - EXIT

echo; echo "== 3. an agent run against a real SGLang server (scripted test model, real parsers)"
examples/agents/run_against_scripted_server.sh
