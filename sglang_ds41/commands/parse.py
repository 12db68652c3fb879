"""`sglang-ds41 parse`: a raw completion (text or token ids) -> the OpenAI assistant message."""

from __future__ import annotations

import argparse
import sys

NAME = "parse"
HELP = "Parse raw model output into reasoning, content and tool calls (JSON on stdout)."


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "file", nargs="?", default="-", metavar="FILE", help="completion text, or - for stdin"
    )
    parser.add_argument(
        "--ids", action="store_true", help="the input is a JSON list of V4.1 token ids, not text"
    )
    parser.add_argument(
        "--thinking",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="the prompt ended with <think>, so output starts in reasoning (default: on)",
    )
    parser.add_argument("--tools", action="store_true", help="tools were declared: parse DSML tool calls")
    parser.add_argument(
        "--required", action="store_true", help="the prompt opened the calls block (tool_choice required)"
    )
    parser.add_argument("--json-output", action="store_true", help="response_format json_object")
    parser.add_argument(
        "--tolerant",
        action="store_true",
        help="also read call spellings besides V4.1's, as the server does (docs/ENCODING.md §4.5)",
    )
    parser.add_argument("--finish-reason", choices=["stop", "length"], default="stop")
    parser.add_argument("--seed", type=int, help="make tool-call ids reproducible")


def _read(path: str) -> str:
    from sglang_ds41.errors import Ds41Error

    if path == "-":
        return sys.stdin.read()
    try:
        with open(path, encoding="utf-8") as f:
            return f.read()
    except OSError as error:
        raise Ds41Error(f"cannot read completion file {path}: {error.strerror}") from error
    except UnicodeDecodeError as error:
        raise Ds41Error(f"completion file {path} is not UTF-8 text: {error}") from error


def run(args: argparse.Namespace) -> int:
    import json

    from sglang_ds41.encoding.conversation import ParsingOptions
    from sglang_ds41.encoding.parse import parse_ids, parse_text
    from sglang_ds41.encoding.stream import random_tool_call_id, seeded_tool_call_ids
    from sglang_ds41.errors import Ds41Error

    options = ParsingOptions(
        thinking=args.thinking,
        parse_tool_calls=args.tools or args.required,
        starts_in_tool_calls=args.required,
        parse_json_output=args.json_output,
        tolerant=args.tolerant,
    )
    ids_source = random_tool_call_id if args.seed is None else seeded_tool_call_ids(args.seed)
    raw = _read(args.file)
    if args.ids:
        try:
            ids = json.loads(raw)
        except json.JSONDecodeError as error:
            raise Ds41Error(f"--ids expects a JSON list of token ids: {error}") from error
        if not isinstance(ids, list):
            raise Ds41Error(f"--ids expects a JSON list of token ids, got {type(ids).__name__}")
        message = parse_ids(ids, options, args.finish_reason, tool_call_id=ids_source)
    else:
        message = parse_text(raw, options, args.finish_reason, tool_call_id=ids_source)
    out = {"message": message.to_openai(), "finish_reason": message.finish_reason, **message.diagnostics()}
    print(json.dumps(out, ensure_ascii=False, indent=2))
    return 0
