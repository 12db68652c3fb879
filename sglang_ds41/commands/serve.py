"""`sglang-ds41 serve`: start an SGLang server for a V4.1 checkpoint (our backend, parsers, CPU settings)."""

from __future__ import annotations

import argparse

NAME = "serve"
PASSTHROUGH = True  # unknown flags (--port, --tp, ...) go to sglang.launch_server
HELP = (
    "Serve a DeepSeek-V4.1 checkpoint with SGLang (python -m sglang.launch_server) and the V4.1 "
    "reasoning and tool-call parsers, as DeepSeek-V4.1-Flash with cache reports: on a GPU upstream "
    "SGLang's V4.1 model with the sglang-ds41 plugin (MXFP4 or NVFP4 Engram tables), without one (or with "
    "--device cpu) the sglang-ds41 CPU backend with its CPU settings. The checkpoint is validated "
    "first (as `inspect` does). Every other argument is passed to SGLang and overrides our defaults "
    "(--port, --tp, --device, --served-model-name, --chunked-prefill-size, --disable-radix-cache, ...)."
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    source = parser.add_mutually_exclusive_group()
    source.add_argument(
        "--tiny",
        action="store_true",
        help="serve the embedded default: the tiny model trained on the synthetic agent corpus "
        "(shipped with the package, expanded once into the cache; docs/TRAINING.md) instead of MODEL_DIR",
    )
    source.add_argument(
        "--tiny-random",
        action="store_true",
        help="serve make-tiny's random tiny checkpoint (built once into the cache; the exactness checks)",
    )
    source.add_argument(
        "--scripted",
        action="store_true",
        help="serve the scripted test model, which plays the example agent runs (examples/agents/)",
    )
    parser.add_argument(
        "--thinking-token-budget",
        type=_token_budget,
        metavar="N",
        help="end every thinking request's reasoning after N tokens (</think> included) unless the "
        "request sets thinking_token_budget (docs/ENCODING.md §4.4)",
    )
    parser.add_argument(
        "--no-incremental-encoding",
        action="store_true",
        help="render and tokenize every V4.1 prompt with upstream's deepseek-recipe adapter instead of "
        "the plugin's incremental encoder, which reuses the ids of the history a request repeats "
        "(the same ids; docs/ENCODING.md §10.3)",
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
        "--log-file",
        metavar="PATH",
        default=None,
        help="where SGLang's own output goes (default: ~/.cache/sglang-ds41/logs/serve-PORT.log)",
    )
    parser.add_argument(
        "--verbose", action="store_true", help="show SGLang's own output here instead of in the log file"
    )
    from sglang_ds41.cli import VersionAction

    parser.add_argument("--version", action=VersionAction)
    parser.add_argument(
        "args",
        nargs=argparse.REMAINDER,
        metavar="MODEL_DIR [SGLANG_ARGS]",
        help="the checkpoint directory (or --model-path DIR; omit with --tiny, --tiny-random or "
        "--scripted), then flags for sglang.launch_server",
    )


def _token_budget(text: str) -> int:
    from sglang_ds41.encoding.errors import EncodingError
    from sglang_ds41.encoding.reasoning import thinking_token_budget

    value = int(text) if text.lstrip("-").isdecimal() else text
    try:
        return thinking_token_budget(value, "--thinking-token-budget")
    except EncodingError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def model_source(args: argparse.Namespace, rest: list[str]) -> tuple[str | None, list[str]]:
    """The checkpoint (MODEL_DIR, --model-path / --model DIR, or None for --tiny / --tiny-random /
    --scripted) and the SGLang flags left."""
    from sglang_ds41.errors import Ds41Error
    from sglang_ds41.serve import launcher as serve

    positional = None
    if rest and not rest[0].startswith("-"):
        positional, rest = rest[0], rest[1:]
    flagged, rest = serve.take_model_path(rest)
    if positional is not None and flagged is not None and positional != flagged:
        raise Ds41Error(f"two checkpoints given: MODEL_DIR {positional!r} and --model-path {flagged!r}")
    given = positional or flagged
    flags = {"--tiny": args.tiny, "--tiny-random": args.tiny_random, "--scripted": args.scripted}
    own = next((flag for flag, chosen in flags.items() if chosen), None)
    if own and given is not None:
        raise Ds41Error(f"{own} serves its own checkpoint; drop MODEL_DIR {given!r}")
    if own is None and given is None:
        raise Ds41Error(
            "which checkpoint? give MODEL_DIR (or --model-path DIR, as for sglang.launch_server), "
            "--tiny for the trained tiny model, --tiny-random for the random tiny test checkpoint, or "
            "--scripted for the scripted agent model"
        )
    return given, rest


def run(args: argparse.Namespace) -> int:
    from pathlib import Path

    from sglang_ds41 import cache
    from sglang_ds41.serve import launcher as serve

    rest = list(args.args)
    if rest[:1] == ["--"]:
        rest = rest[1:]
    given, rest = model_source(args, rest)
    cpu = serve.engine_is_cpu(rest)
    if not args.dry_run:
        serve.check_environment(cpu)  # before anything is built or started
    if args.tiny:
        model_dir = cache.trained_tiny_checkpoint()
    elif args.tiny_random:
        model_dir = cache.tiny_checkpoint()
    elif args.scripted:
        model_dir = cache.scripted_checkpoint()
    else:
        model_dir = Path(given)
    what = serve.validate_checkpoint(model_dir)
    budget = args.thinking_token_budget
    launch = serve.build_launch(
        model_dir,
        rest,
        gpu=not cpu,
        thinking_token_budget=budget,
        incremental_encoding=not args.no_incremental_encoding,
    )
    if args.dry_run:
        print(f"# checkpoint: {model_dir} ({what})\n{serve.describe(launch)}")
        return 0
    serve.check_port_free(launch.host, launch.port)
    log = None if args.verbose else Path(args.log_file or serve.default_log_path(launch.port))
    serving = f"{model_dir}: {what}; {serve.engine_name(launch)}"
    return serve.serve(launch, ready_timeout_s=args.ready_timeout, log_path=log, serving=serving)
