#!/usr/bin/env bash
# The main job on the embedded default. Until the tiny SGLang server lands (issue 5), this shows
# the V4.1 prompt format end to end: a request is rendered to the exact prompt and token ids,
# and a model completion is parsed back into reasoning, content and tool calls.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
VENV=${VENV:-"$ROOT/.venv"}
"$ROOT/scripts/setup.sh"
cd "$ROOT"
ds41() { "$VENV/bin/sglang-ds41" "$@"; }

echo "== 1. two interleaved images (examples/example_harmony.json) -> prompt"
ds41 render examples/example_harmony.json; echo
echo "== token ids (each image is one <｜deepseek_image｜> id, 129264):"
ds41 render examples/example_harmony.json --tokens; echo

echo "== 2. a tool-calling request in thinking mode (examples/weather_request.json) -> prompt"
ds41 render examples/weather_request.json; echo

echo "== 3. the model's completion (examples/weather_completion.txt) -> OpenAI message"
ds41 parse examples/weather_completion.txt --thinking --tools

echo "== 4. Engram host memory for the official config at TP=4"
ds41 engram-plan tests/fixtures/official_config.json --tp 4
