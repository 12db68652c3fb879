"""Chat with the tiny V4.1 model served by SGLang, and check the server against the reference.

    sglang-ds41 serve --tiny --port 30000 &
    python examples/chat_tiny_server.py --base-url http://127.0.0.1:30000/v1

`serve --tiny` is the trained tiny model (docs/TRAINING.md); `serve --tiny-random` the random
one, whose words are noise. Either way every greedy token must equal what the pure-PyTorch
reference model (`sglang-ds41 generate`) computes for the same prompt, in the same dtype:
float32 for both by default (`--dtype float64` with a server started with
`SGLANG_DS41_DTYPE=float64`). The checkpoint is the one the server reports (`/model_info`)
unless `--model-dir` names it.
"""

from __future__ import annotations

import argparse
import json
import sys
import urllib.request

import openai
from _tiny_server import DTYPES, served_model_dir, server_root  # this folder
from sglang_ds41.encoding import encode_prompt, render_request

from sglang_ds41.assets import v41_tokenizer
from sglang_ds41.reference.generate import generate
from sglang_ds41.reference.weights import load_reference

QUESTION = "What is the capital of France? Answer in one word."


def server_greedy(base_url: str, ids: list[int], steps: int) -> list[int]:
    sampling = {"max_new_tokens": steps, "temperature": 0, "ignore_eos": True}
    body = {"input_ids": ids, "sampling_params": sampling}
    request = urllib.request.Request(
        f"{base_url}/generate", json.dumps(body).encode(), {"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=600) as reply:
        return json.loads(reply.read())["output_ids"]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--base-url", required=True, help="the server's OpenAI API: http://127.0.0.1:30000/v1"
    )
    parser.add_argument("--model-dir", help="the checkpoint the server serves (default: what it reports)")
    parser.add_argument("--dtype", choices=sorted(DTYPES), default="float32", help="the server's dtype")
    parser.add_argument("--steps", type=int, default=16)
    args = parser.parse_args()
    root = server_root(args.base_url)
    model_dir = args.model_dir or served_model_dir(root)

    client = openai.OpenAI(base_url=args.base_url, api_key="unused", timeout=600, max_retries=0)
    messages = [{"role": "user", "content": QUESTION}]
    reply = client.chat.completions.create(
        model="DeepSeek-V4.1-Flash", messages=messages, max_tokens=args.steps, temperature=0
    )
    message = reply.choices[0].message
    print(f"user: {QUESTION}")
    print(f"assistant (reasoning): {getattr(message, 'reasoning_content', None)!r}")
    print(f"assistant (content):   {message.content!r}")
    print(f"usage: {reply.usage.prompt_tokens} prompt + {reply.usage.completion_tokens} completion tokens")

    ids = encode_prompt(render_request({"model": "DeepSeek-V4.1-Flash", "messages": messages}))
    served = server_greedy(root, ids, args.steps)
    reference = generate(load_reference(model_dir, DTYPES[args.dtype]), ids, args.steps)
    same = served == reference
    print(f"\nprompt: {len(ids)} ids (our renderer; the server counted {reply.usage.prompt_tokens})")
    print(f"server greedy:    {served}")
    print(f"reference greedy: {reference}")
    print(f"decoded: {v41_tokenizer().decode(served)!r}")
    print(f"server == reference, token for token: {same} ({args.dtype}, {model_dir})")
    return 0 if same and len(ids) == reply.usage.prompt_tokens else 1


if __name__ == "__main__":
    sys.exit(main())
