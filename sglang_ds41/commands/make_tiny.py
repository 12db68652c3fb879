"""`sglang-ds41 make-tiny`: write a tiny random checkpoint laid out exactly like the release."""

from __future__ import annotations

import argparse

NAME = "make-tiny"
HELP = (
    "Write a tiny random DeepSeek-V4.1 checkpoint (real tokenizer, official tensor names and "
    "formats) for tests and local serving."
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("out_dir", metavar="OUT_DIR", help="directory to create (must be empty or absent)")
    parser.add_argument(
        "--variant",
        choices=["base", "nvfp4"],
        default="base",
        help="base: MXFP4 routed experts (deepseek-ai release); nvfp4: NVFP4 routed experts + "
        "hf_quant_config.json (NVIDIA release). Default base.",
    )
    parser.add_argument(
        "--engram",
        choices=["fp8", "mxfp4", "nvfp4"],
        default="fp8",
        help="Engram table format (default fp8; mxfp4 / nvfp4 are the FP8 tables re-encoded as "
        "convert-engram does by default)",
    )
    parser.add_argument("--seed", type=int, default=0, help="random seed (default 0)")


def run(args: argparse.Namespace) -> int:
    from sglang_ds41.checkpoint.tiny import write_tiny

    out = write_tiny(args.out_dir, variant=args.variant, engram=args.engram, seed=args.seed)
    print(f"wrote tiny {args.variant} checkpoint (Engram {args.engram}, seed {args.seed}) to {out}")
    return 0
