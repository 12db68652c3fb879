#!/usr/bin/env bash
# The weather/calculator agent against a real SGLang server serving the scripted test model.
#
#   examples/agents/run_against_scripted_server.sh [--port N] [--keep-log]
#
# Builds the scripted checkpoint once (cached under $SGLANG_DS41_CACHE, default
# ~/.cache/sglang-ds41, keyed by the scripts so a change rebuilds it), starts
# `sglang-ds41 serve` in the background, waits until it answers, runs
# examples/agents/weather_calculator.py against it printing the whole transcript, and stops
# the server by its PID on exit (also on Ctrl-C or an error). Meant to be called from
# scripts/demo.sh as well. Environment: PYTHON (default: the repo's .venv), READY_TIMEOUT_S.
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$REPO"
PYTHON="${PYTHON:-$([ -x .venv/bin/python ] && echo .venv/bin/python || echo python3)}"
READY_TIMEOUT_S="${READY_TIMEOUT_S:-300}"
PORT=""
KEEP_LOG=0
while [ $# -gt 0 ]; do
  case "$1" in
    --port) PORT="$2"; shift 2 ;;
    --keep-log) KEEP_LOG=1; shift ;;
    *) echo "usage: $0 [--port N] [--keep-log]" >&2; exit 2 ;;
  esac
done

# 1. The scripted checkpoint, cached by a hash of its config (scripts included).
CACHE="${SGLANG_DS41_CACHE:-$HOME/.cache/sglang-ds41}"
CHECKPOINT="$("$PYTHON" - "$CACHE" <<'EOF'
import hashlib, json, os, shutil, sys, tempfile
from pathlib import Path
from sglang_ds41.backend.scripted import scripted_config, write_scripted_checkpoint

key = hashlib.sha256(json.dumps(scripted_config(), sort_keys=True).encode()).hexdigest()[:12]
target = Path(sys.argv[1]) / f"scripted-{key}"
if not (target / "config.json").is_file():
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(dir=target.parent, prefix=".staging-"))
    write_scripted_checkpoint(staging / "ckpt")
    try:
        os.rename(staging / "ckpt", target)  # atomic: a concurrent builder may have won
    except OSError:
        pass
    shutil.rmtree(staging, ignore_errors=True)
print(target)
EOF
)"
echo "scripted checkpoint: $CHECKPOINT"

# 2. The server, in the background, stopped by PID whatever happens next.
if [ -z "$PORT" ]; then
  PORT="$("$PYTHON" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')"
fi
URL="http://127.0.0.1:$PORT"
LOG="$(mktemp -t sglang-ds41-scripted-XXXXXX.log)"
SERVER_PID=""
stop_server() {
  if [ -n "$SERVER_PID" ] && kill -0 "$SERVER_PID" 2>/dev/null; then
    kill -TERM "$SERVER_PID" 2>/dev/null || true  # serve stops SGLang's process group on SIGTERM
    for _ in $(seq 1 60); do kill -0 "$SERVER_PID" 2>/dev/null || break; sleep 0.5; done
    kill -KILL "$SERVER_PID" 2>/dev/null || true
    wait "$SERVER_PID" 2>/dev/null || true
  fi
  if [ "$KEEP_LOG" = 1 ]; then echo "server log: $LOG"; else rm -f "$LOG"; fi
}
trap stop_server EXIT
trap 'exit 130' INT TERM

T0=$SECONDS
"$PYTHON" -m sglang_ds41 serve "$CHECKPOINT" --port "$PORT" >"$LOG" 2>&1 &
SERVER_PID=$!
echo "starting sglang-ds41 serve (pid $SERVER_PID) on $URL ..."
until curl -sf -o /dev/null "$URL/health_generate"; do
  if ! kill -0 "$SERVER_PID" 2>/dev/null; then
    echo "the server exited before it was ready; last lines of its log:" >&2
    tail -n 40 "$LOG" >&2
    exit 1
  fi
  if [ $((SECONDS - T0)) -ge "$READY_TIMEOUT_S" ]; then
    echo "the server was not ready after ${READY_TIMEOUT_S} s; last lines of its log:" >&2
    tail -n 40 "$LOG" >&2
    exit 1
  fi
  sleep 1
done
echo "server ready after $((SECONDS - T0)) s"

# 3. The agent: the trigger makes the scripted model play a whole weather/calculator run.
T1=$SECONDS
"$PYTHON" examples/agents/weather_calculator.py --base-url "$URL/v1" --transcript \
  --question "[script:weather-calculator] What is the average temperature of Paris and Oslo right now?"
echo "agent run took $((SECONDS - T1)) s"
