"""`sglang-ds41 serve`: start an SGLang server for a V4.1 checkpoint (our backend, parsers, CPU settings)."""

from __future__ import annotations

import argparse

NAME = "serve"
PASSTHROUGH = True  # unknown flags (--port, --tp, ...) go to sglang.launch_server
HELP = (
    "Serve a DeepSeek-V4.1 checkpoint with SGLang (python -m sglang.launch_server) and the V4.1 "
    "reasoning and tool-call parsers: on a GPU upstream SGLang's V4.1 model with the sglang-ds41 "
    "plugin (MXFP4 Engram tables), without one (or with --device cpu) the sglang-ds41 CPU backend "
    "with its CPU settings. Every other argument is passed to SGLang and overrides our defaults "
    "(--port, --tp, --device, --chunked-prefill-size, --disable-radix-cache, ...)."
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--tiny",
        action="store_true",
        help="serve the tiny random checkpoint (built once into the cache) instead of MODEL_DIR",
    )
    parser.add_argument(
        "--dry-run",
        action="store_true",
        help="print the engine, the exact command and its environment, and exit without starting it",
    )
    parser.add_argument(
        "--ready-timeout", type=float, default=600.0, metavar="S", help="give up if not ready after S seconds"
    )
    parser.add_argument(
        "args",
        nargs=argparse.REMAINDER,
        metavar="MODEL_DIR [SGLANG_ARGS]",
        help="the checkpoint directory (omit with --tiny), then flags for sglang.launch_server",
    )


def run(args: argparse.Namespace) -> int:
    from sglang_ds41.backend import serve
    from sglang_ds41.errors import Ds41Error

    rest = list(args.args)
    if rest[:1] == ["--"]:
        rest = rest[1:]
    if args.tiny:
        if rest and not rest[0].startswith("-"):
            raise Ds41Error(f"--tiny serves the tiny checkpoint; drop MODEL_DIR {rest[0]!r}")
        model_dir = serve.tiny_checkpoint()
    elif not rest or rest[0].startswith("-"):
        raise Ds41Error("missing MODEL_DIR (or --tiny before it)")
    else:
        model_dir, rest = rest[0], rest[1:]
    launch = serve.build_launch(model_dir, rest)
    if args.dry_run:
        print(serve.describe(launch))
        return 0
    return serve.serve(launch, ready_timeout_s=args.ready_timeout)
