#!/usr/bin/env bash
# The main job on the embedded default: the README's Examples, command for command (a test checks
# that the two lists stay the same): the V4.1 prompt format; the trained tiny DeepSeek-V4.1
# (official layout and formats, real tokenizer) served by a real SGLang server on this machine's
# CPU, checked token for token against the pure-PyTorch reference, then driving the agent
# examples itself. Servers get a free port instead of the README's 30000, and scratch files a
# temporary directory instead of /tmp.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
VENV=${VENV:-"$ROOT/.venv"}
"$ROOT/scripts/setup.sh"
cd "$ROOT"
sglang-ds41() { "$VENV/bin/sglang-ds41" "$@"; }
python() { "$VENV/bin/python" "$@"; }

PORT=$(python -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
TMPD=$(mktemp -d -t sglang-ds41-demo-XXXXXX)
SERVER=""
stop_server() {
  if [[ -n "$SERVER" ]]; then
    kill -TERM "$SERVER" 2>/dev/null || true  # serve stops SGLang's process group on SIGTERM
    wait "$SERVER" 2>/dev/null || true
    SERVER=""
  fi
}
trap 'stop_server; rm -rf "$TMPD"' EXIT
serve_bg() {  # `CMD &` of the README, then wait for the server's "ready" line
  local program=$1 out
  shift
  # a file of its own per server: a stopped server's last writes cannot fake this one's "ready"
  out=$(mktemp "$TMPD/serve-XXXXXX.out")
  # the program itself, not the shell function: $! must be serve's own PID for stop_server
  "$VENV/bin/$program" "$@" >"$out" 2>&1 &
  SERVER=$!
  until grep -q "ready after" "$out"; do
    kill -0 "$SERVER" 2>/dev/null || { cat "$out"; exit 1; }
    sleep 1
  done
  cat "$out"
}

echo "== 1. the V4.1 prompt format: a two-image request -> prompt; a completion -> message"
sglang-ds41 render examples/example_harmony.json
echo
sglang-ds41 parse examples/weather_completion.txt --thinking --tools

echo; echo "== 2. the embedded default, the trained tiny V4.1, served by SGLang on CPU: checked against"
echo "   the reference, then driving the agents (the model decides every step; docs/TRAINING.md)"
serve_bg sglang-ds41 serve --tiny --port $PORT
python examples/chat_tiny_server.py --base-url http://127.0.0.1:$PORT/v1
python examples/vision_tiny_server.py --base-url http://127.0.0.1:$PORT/v1
sglang-ds41 agent examples/agents/weather.yaml --base-url http://127.0.0.1:$PORT/v1 --stream
sglang-ds41 agent examples/agents/weather.yaml --base-url http://127.0.0.1:$PORT/v1 --run-dir $TMPD/ds41-run
sglang-ds41 agent examples/agents/weather.yaml --base-url http://127.0.0.1:$PORT/v1 --resume $TMPD/ds41-run
python examples/agents/weather_calculator.py --base-url http://127.0.0.1:$PORT/v1 --transcript
python examples/agents/file_workspace.py $TMPD/ds41-workspace --base-url http://127.0.0.1:$PORT/v1
python examples/agents/extract_invoice.py --base-url http://127.0.0.1:$PORT/v1
stop_server

echo; echo "== 3. the same agents with no server (an in-process scripted server plays the intended runs)"
python examples/agents/weather_calculator.py --scripted
python examples/agents/file_workspace.py $TMPD/ds41-workspace --scripted
python examples/agents/extract_invoice.py --scripted
