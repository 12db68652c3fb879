#!/usr/bin/env bash
# Train the embedded default again and pack it (docs/TRAINING.md §4): one run of 3,600 steps in
# five phases, each carried on from the last with other settings (`train-tiny --continue-from`).
#
#   scripts/train_default.sh [RUNS_DIR] [BUNDLE_DIR]
#       RUNS_DIR    where the phases' run directories go (default runs/tiny-default)
#       BUNDLE_DIR  where the packed model goes (default sglang_ds41/assets/tiny-trained)
#   environment: THREADS  torch threads (default 2, this machine's cores; the shipped run used 2)
#                VENV     the environment scripts/setup.sh made (default .venv)
#
# Interrupted, run it again: a phase that has begun resumes from its last save (every 50 steps).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
RUNS=$(realpath -m "${1:-$ROOT/runs/tiny-default}")
BUNDLE=$(realpath -m "${2:-$ROOT/sglang_ds41/assets/tiny-trained}")
TRAIN=("${VENV:-$ROOT/.venv}/bin/sglang-ds41" train-tiny --threads "${THREADS:-2}")

# phase NAME UNTIL SOURCE [FLAGS...]: train RUNS/NAME to step UNTIL, from scratch (no SOURCE) or
# carried on from RUNS/SOURCE with FLAGS; a run already begun resumes with its own settings.
phase() {
    local name=$1 until=$2 source=$3
    shift 3
    if [[ -e "$RUNS/$name/settings.json" ]]; then
        "${TRAIN[@]}" "$RUNS/$name" --until "$until"
    elif [[ -z "$source" ]]; then
        "${TRAIN[@]}" "$RUNS/$name" --until "$until" "$@"
    else
        "${TRAIN[@]}" "$RUNS/$name" --continue-from "$RUNS/$source" --until "$until" "$@"
    fi
}

# 1. Spelling drills only, at 1e-3 (the rate where the copying circuit forms): the
#    space-free spelling of the vocabulary's capitalised words, each word right before its spelling.
phase 1-spell 500 "" --lr 1e-3 --steps 3000 --drill-warmup 3000 --spelling-drills 1.0 \
    --spelling-gap 0 --vocabulary-names 0.5
# 2. The same words found from up to 12 words back, after up to 12 others, with up to 3 more pieces.
phase 2-reach 1600 1-spell --spelling-lead 12 --spelling-gap 12 --spelling-tail 3
# 3. ... from up to 48 words back.
phase 3-far 1900 2-reach --spelling-gap 48
# 4. The corpus, each batch with half as many drill tokens again: half spelling, half name
#    drills (the corpus's call turns with drilled words as names); the schedule now 5,000 long.
phase 4-corpus 3200 3-far --steps 5000 --drill-warmup 1900 --drill-share 0.5 --spelling-drills 0.5 \
    --name-drills 0.5
# 5. Cool-down: the same batches, the schedule now ending at 3,600, so the rate drops from 3.6e-4
#    to 1.3e-4 and falls to 1e-4.
phase 5-cool 3600 4-corpus --steps 3600
"${TRAIN[@]}" "$RUNS/5-cool" --until 3600 --bundle "$BUNDLE"
