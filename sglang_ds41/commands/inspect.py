"""`sglang-ds41 inspect`: check a checkpoint against its config and summarise it."""

from __future__ import annotations

import argparse

NAME = "inspect"
HELP = (
    "Validate a checkpoint directory (config, index, shard headers: every tensor's name, shape, dtype "
    "and format) and print a summary."
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("model_dir", metavar="MODEL_DIR", help="Hugging Face style checkpoint directory")
    parser.add_argument("--json", action="store_true", help="print the summary as JSON")


def run(args: argparse.Namespace) -> int:
    import json

    from sglang_ds41.checkpoint.inspect import inspect_checkpoint, render

    summary = inspect_checkpoint(args.model_dir)
    print(json.dumps(summary, indent=2) if args.json else render(summary))
    return 0
