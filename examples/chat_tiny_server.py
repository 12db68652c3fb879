"""Chat with the tiny V4.1 model served by SGLang, and check the server against the reference.

    python examples/chat_tiny_server.py --base-url http://127.0.0.1:30000 --model-dir DIR

The server must compute in float64 (`SGLANG_DS41_DTYPE=float64 sglang-ds41 serve ...`) for the
token-for-token check: the tiny model has random weights, so its words are noise, but every
greedy token must equal what the pure-PyTorch reference model computes for the same prompt.
"""

from __future__ import annotations

import argparse
import json
import sys
import urllib.request

import openai
import torch
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
    parser.add_argument("--base-url", required=True, help="the server, e.g. http://127.0.0.1:30000")
    parser.add_argument("--model-dir", required=True, help="the checkpoint the server serves")
    parser.add_argument("--steps", type=int, default=16)
    args = parser.parse_args()

    client = openai.OpenAI(base_url=f"{args.base_url}/v1", api_key="unused", timeout=600, max_retries=0)
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
    served = server_greedy(args.base_url, ids, args.steps)
    reference = generate(load_reference(args.model_dir, torch.float64), ids, args.steps)
    same = served == reference
    print(f"\nprompt: {len(ids)} ids (our renderer; the server counted {reply.usage.prompt_tokens})")
    print(f"server greedy:    {served}")
    print(f"reference greedy: {reference}")
    print(f"decoded: {v41_tokenizer().decode(served)!r}")
    print(f"server == reference, token for token: {same}")
    return 0 if same and len(ids) == reply.usage.prompt_tokens else 1


if __name__ == "__main__":
    sys.exit(main())
