"""`sglang-ds41 generate MODEL_DIR --prompt TEXT`: decode with the pure-PyTorch reference model."""

from __future__ import annotations

import argparse
import json
import sys

NAME = "generate"
HELP = (
    "Generate text with the pure-PyTorch reference model (CPU; tiny checkpoints), or run its "
    "self-test with --selftest."
)
DTYPES = ("float32", "float64", "bfloat16")
DEFAULT_PROMPT = "The quick brown fox jumps over the lazy dog because"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "model_dir", metavar="MODEL_DIR", nargs="?", help="checkpoint directory (config.json + safetensors)"
    )
    source = parser.add_mutually_exclusive_group()
    source.add_argument(
        "--tiny", action="store_true", help="the embedded default: the trained tiny model (docs/TRAINING.md)"
    )
    source.add_argument("--tiny-random", action="store_true", help="the random tiny checkpoint (make-tiny)")
    parser.add_argument("--prompt", help="prompt text (raw: BOS + the text's tokens, special tokens parsed)")
    parser.add_argument(
        "--chat",
        action="store_true",
        help="render --prompt as one user message of a chat request (V4.1 prompt format)",
    )
    parser.add_argument("--max-new-tokens", type=int, default=32, help="tokens to generate (default 32)")
    parser.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default)")
    parser.add_argument("--seed", type=int, default=0, help="sampling seed (default 0)")
    parser.add_argument("--dtype", choices=DTYPES, default="float32", help="model dtype (default float32)")
    parser.add_argument(
        "--threads", type=int, default=1, help="torch CPU threads (default 1: tiny ops run fastest on one)"
    )
    parser.add_argument(
        "--json",
        action="store_true",
        help='print {"prompt_token_ids": [...], "token_ids": [...], "text": "..."}',
    )
    parser.add_argument(
        "--selftest",
        action="store_true",
        help="prefill + 22 greedy decode steps, checked against one-shot forwards; exit 1 on failure",
    )


def run(args: argparse.Namespace) -> int:
    from pathlib import Path

    import torch

    from sglang_ds41.errors import Ds41Error
    from sglang_ds41.reference.generate import generate, selftest
    from sglang_ds41.reference.weights import load_reference

    own = "--tiny" if args.tiny else "--tiny-random" if args.tiny_random else None
    if own and args.model_dir:
        raise Ds41Error(f"{own} uses its own checkpoint; drop MODEL_DIR {args.model_dir!r}")
    if not own and not args.model_dir:
        raise Ds41Error("which checkpoint? give MODEL_DIR, --tiny (trained) or --tiny-random")
    if own:
        from sglang_ds41 import cache

        built = cache.trained_tiny_checkpoint() if args.tiny else cache.tiny_checkpoint()
        args.model_dir = str(built)
    if args.max_new_tokens < 1:
        raise Ds41Error(f"--max-new-tokens must be >= 1, got {args.max_new_tokens}")
    if args.prompt is None and not args.selftest:
        raise Ds41Error("--prompt is required (except with --selftest)")
    torch.set_num_threads(max(1, args.threads))
    model = load_reference(args.model_dir, dtype=getattr(torch, args.dtype))
    tokenizer = _tokenizer(Path(args.model_dir))
    prompt_ids = _prompt_ids(args.prompt or DEFAULT_PROMPT, args.chat, model.config.bos_token_id, tokenizer)
    if args.selftest:
        report = selftest(model, prompt_ids)
        result = {
            "ok": report.ok,
            "prompt_tokens": len(report.prompt_ids),
            "decode_steps": len(report.token_ids),
            "decode_max_rel_diff": report.decode_max_diff,
            "chunked_prefill_max_rel_diff": report.chunked_max_diff,
            "tolerance": report.tolerance,
            "token_ids": report.token_ids,
            "problems": report.problems,
        }
        if args.json:
            print(json.dumps(result))
        else:
            verdict = "passed" if report.ok else "FAILED"
            print(f"selftest {verdict} ({args.dtype}, {len(prompt_ids)}-token prompt)")
            print(f"  decode vs one-shot:  max rel diff {report.decode_max_diff:.3g}")
            print(f"  tolerance:           {report.tolerance:g}")
            print(f"  chunked vs one-shot: max rel diff {report.chunked_max_diff:.3g}")
            print(f"  greedy tokens: {report.token_ids}")
            for problem in report.problems:
                print(f"  problem: {problem}", file=sys.stderr)
        return 0 if report.ok else 1
    tokens = generate(
        model,
        prompt_ids,
        args.max_new_tokens,
        temperature=args.temperature,
        stop_ids=(model.config.eos_token_id,),
        seed=args.seed,
    )
    text = tokenizer.decode(tokens, skip_special_tokens=False)
    if args.json:
        print(
            json.dumps(
                {"prompt_token_ids": prompt_ids, "token_ids": tokens, "text": text}, ensure_ascii=False
            )
        )
    else:
        print(text)
    return 0


def _tokenizer(model_dir):
    """The checkpoint's tokenizer.json if it ships one, else the packaged V4.1 tokenizer."""
    from tokenizers import Tokenizer

    from sglang_ds41.checkpoint.load import tokenizer_json

    return Tokenizer.from_file(str(tokenizer_json(model_dir)))


def _prompt_ids(prompt: str, chat: bool, bos: int, tokenizer) -> list[int]:
    if chat:
        from sglang_ds41.encoding import encode_prompt, render_request

        request = {"model": "DeepSeek-V4.1-Flash", "messages": [{"role": "user", "content": prompt}]}
        return encode_prompt(render_request(request))
    return [bos, *tokenizer.encode(prompt, add_special_tokens=False).ids]
