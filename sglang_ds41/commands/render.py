"""`sglang-ds41 render REQUEST.json`: print the V4.1 prompt of a Chat Completions request."""

from __future__ import annotations

import argparse
import json
import sys

NAME = "render"
HELP = "Render an OpenAI Chat Completions request (JSON file, '-' = stdin) as a V4.1 prompt."


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("request", help="request JSON file, or '-' to read standard input")
    parser.add_argument("--tokens", action="store_true", help="print the prompt's token ids as a JSON list")


def run(args: argparse.Namespace) -> int:
    from sglang_ds41.encoding import encode_prompt, render_request

    body = _read_request(args.request)
    # The JSON text (not a dict) is passed on so numbers keep serde semantics (1.50, big ints).
    rendered = render_request(body)
    if args.tokens:
        sys.stdout.write(json.dumps(encode_prompt(rendered)) + "\n")
    else:
        sys.stdout.buffer.write(rendered.prompt.text.encode("utf-8"))
    sys.stdout.flush()
    return 0


def _read_request(path: str) -> bytes:
    from sglang_ds41.encoding import EncodingError

    if path == "-":
        return sys.stdin.buffer.read()
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError as error:
        raise EncodingError(f"cannot read request file {path!r}: {error.strerror}") from None
