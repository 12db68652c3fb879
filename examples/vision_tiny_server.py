"""Ask the tiny V4.1 model served by SGLang about two images, and check it against the reference.

    sglang-ds41 serve --tiny --port 30000 &
    python examples/vision_tiny_server.py --base-url http://127.0.0.1:30000/v1

Sends `examples/example_harmony.json` (a user turn with two interleaved `image_url` parts, data
URLs) to `/v1/chat/completions`. The tiny model never saw an image (its vision tower keeps make-
tiny's random weights), so what it says about them is noise; what must hold is that the server
saw the prompt the official renderer gives (its prompt token count is the rendered ids with each
image placeholder expanded to the image's span) and that every greedy token equals the pure-
PyTorch reference model's for the same prompt and pixels, in the server's dtype (float32 by
default, `--dtype float64` for a server started with `SGLANG_DS41_DTYPE=float64`). The
checkpoint is the one the server reports (`/model_info`) unless `--model-dir` names it.
"""

from __future__ import annotations

import argparse
import json
import sys
import urllib.request
from pathlib import Path

import openai
from _tiny_server import DTYPES, served_model_dir, server_root  # this folder
from sglang_ds41.encoding import encode_prompt, render_request

from sglang_ds41.reference.generate import generate
from sglang_ds41.reference.weights import load_reference
from sglang_ds41.training.evaluate import served_message
from sglang_ds41.vision import GridSpec, build_image_prompt, load_vision_tower, preprocess_image

REQUEST = Path(__file__).parent / "example_harmony.json"


def server_greedy(base_url: str, ids: list[int], images: list[str], steps: int) -> dict:
    """Greedy tokens from the native `/generate` endpoint: prompt ids (one placeholder per
    image) plus the images, so the server expands and embeds them itself."""
    body = {
        "input_ids": ids,
        "image_data": images,
        "sampling_params": {"max_new_tokens": steps, "temperature": 0, "ignore_eos": True},
    }
    request = urllib.request.Request(
        f"{base_url}/generate", json.dumps(body).encode(), {"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=600) as reply:
        return json.loads(reply.read())


def reference_greedy(model_dir: str, ids: list[int], sources, steps: int, dtype) -> tuple[list[int], int]:
    """The reference's greedy tokens and the expanded prompt length (model and tower in `dtype`)."""
    model = load_reference(model_dir, dtype)
    tower = load_vision_tower(model_dir, dtype)
    spec = GridSpec.from_config(model.config.vision)
    images = [preprocess_image(s.url, spec, s.detail) for s in sources]
    prompt = build_image_prompt(ids, images, tower, model.image_token_id)
    tokens = generate(model, prompt.input_ids.tolist(), steps, image_embeds=prompt.image_embeds)
    return tokens, prompt.input_ids.numel()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--base-url", required=True, help="the server's OpenAI API: http://127.0.0.1:30000/v1"
    )
    parser.add_argument("--model-dir", help="the checkpoint the server serves (default: what it reports)")
    parser.add_argument("--dtype", choices=sorted(DTYPES), default="float32", help="the server's dtype")
    parser.add_argument("--request", default=str(REQUEST), help="a chat request with images (JSON)")
    parser.add_argument("--steps", type=int, default=12)
    args = parser.parse_args()
    root = server_root(args.base_url)
    model_dir = args.model_dir or served_model_dir(root)

    request = json.loads(Path(args.request).read_text())
    thinking = (request.get("thinking") or {}).get("type") != "disabled"
    client = openai.OpenAI(base_url=args.base_url, api_key="unused", timeout=600, max_retries=0)
    reply = client.chat.completions.create(
        model=request.get("model", "default"),
        messages=request["messages"],
        max_tokens=args.steps,
        temperature=0,
        extra_body={"chat_template_kwargs": {"thinking": thinking}, "ignore_eos": True},
    )
    message = reply.choices[0].message
    print(f"assistant (reasoning): {getattr(message, 'reasoning_content', None)!r}")
    print(f"assistant (content):   {message.content!r}")
    print(f"usage: {reply.usage.prompt_tokens} prompt + {reply.usage.completion_tokens} completion tokens")

    rendered = render_request(request)
    ids = encode_prompt(rendered)
    sources = rendered.prompt.image_sources
    served = server_greedy(root, ids, [s.url for s in sources], args.steps)["output_ids"]
    reference, expanded = reference_greedy(model_dir, ids, sources, args.steps, DTYPES[args.dtype])
    parsed = served_message(reference, rendered.parsing)  # the reference's ids as the server parses them
    want = (parsed["reasoning_content"] or "", parsed["content"] or "")
    got = (getattr(message, "reasoning_content", None) or "", message.content or "")
    checks = {
        "prompt tokens (server) == rendered ids with image spans expanded": reply.usage.prompt_tokens
        == expanded,
        "server == reference, token for token": served == reference,
        "chat message == the reference's, parsed": got == want,
    }
    print(f"\nprompt: {len(ids)} ids with {len(sources)} image placeholders -> {expanded} positions")
    print(f"server greedy:    {served}")
    print(f"reference greedy: {reference}")
    for name, ok in checks.items():
        print(f"{name}: {ok}")
    return 0 if all(checks.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
