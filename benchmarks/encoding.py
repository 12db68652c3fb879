"""Render + encode throughput of `sglang_ds41.encoding` next to the official `deepseek-recipe`.

Both renderers process the same seeded corpus of Chat Completions requests (multi-turn tool
conversations, thinking on and off, images, JSON formats) in the same run. Reports requests/s
and prompt tokens/s for rendering alone and for rendering + token ids, the ratio ours/recipe,
and where our time goes (validation, rendering, tokenization) from a cProfile pass.

    .venv/bin/python benchmarks/encoding.py [--requests 400] [--repeats 3] [--out PATH]

Writes JSON (benchmarks/results/encoding.json, or --out) and prints a short table.
"""

from __future__ import annotations

import argparse
import base64
import cProfile
import json
import pstats
import random
import time
from pathlib import Path
from typing import Any

import deepseek_recipe as dr
from sglang_ds41.encoding import encode_prompt, render_request
from sglang_ds41.encoding.prompt_ids import prompt_ids
from sglang_ds41.encoding.render import render_conversation
from sglang_ds41.encoding.request import conversation_from_request

from sglang_ds41.assets import TOKENIZER_JSON

RESULTS = Path(__file__).parent / "results"
IMAGE_URL = "data:image/png;base64," + base64.b64encode(
    (Path(__file__).parents[1] / "examples" / "images" / "corn.png").read_bytes()
).decode()
WORDS = [
    "the", "weather", "in", "Paris", "tomorrow", "北京", "天气", "résumé", "numbers", "42", "3.14",
    "<｜User｜>", "JSON", "list", "item",
]  # fmt: skip
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": f"tool_{i}",
            "description": f"Tool number {i}: looks things up.",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}, "days": {"type": "integer", "minimum": 1}},
                "required": ["city"],
            },
        },
    }
    for i in range(4)
]


def sentence(rng: random.Random, n: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(n))


def make_request(rng: random.Random) -> dict[str, Any]:
    """A realistic agent conversation: system, user, several tool rounds, a final user turn."""
    thinking = rng.random() < 0.7
    tools = rng.random() < 0.7
    messages: list[dict[str, Any]] = [{"role": "system", "content": sentence(rng, 30)}]
    user: Any = sentence(rng, rng.randint(5, 80))
    if rng.random() < 0.2:
        user = [{"type": "text", "text": user}, {"type": "image_url", "image_url": {"url": IMAGE_URL}}]
    messages.append({"role": "user", "content": user})
    for round_ in range(rng.randint(0, 4) if tools else 0):
        calls = [
            {
                "id": f"call_{round_}_{k}",
                "type": "function",
                "function": {
                    "name": rng.choice(TOOLS)["function"]["name"],
                    "arguments": json.dumps({"city": sentence(rng, 2), "days": rng.randint(1, 9)}),
                },
            }
            for k in range(rng.randint(1, 3))
        ]
        messages.append(
            {"role": "assistant", "content": "", "reasoning_content": sentence(rng, 40), "tool_calls": calls}
        )
        for call in calls:
            messages.append({"role": "tool", "tool_call_id": call["id"], "content": sentence(rng, 60)})
    messages.append({"role": "user", "content": sentence(rng, 20)})
    body: dict[str, Any] = {"model": "DeepSeek-V4.1-Flash", "messages": messages}
    if tools:
        body["tools"] = TOOLS
    body["thinking"] = {"type": "enabled" if thinking else "disabled"}
    if thinking:
        body["reasoning_effort"] = rng.choice(["low", "high", "max"])
    return body


def recipe_pipeline() -> tuple[Any, Any]:
    special = dr.SpecialTokens(image="<｜deepseek_image｜>")
    options = dr.ConversionOptions().with_special_tokens(special)
    encoding = dr.DeepseekV41Encoding().with_special_tokens(special)
    return options, encoding.with_tokenizer(dr.Tokenizer.from_file(str(TOKENIZER_JSON)))


def time_best(fn, repeats: int) -> float:
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=400)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=RESULTS / "encoding.json")
    args = parser.parse_args()

    rng = random.Random(args.seed)
    bodies = [make_request(rng) for _ in range(args.requests)]
    options, encoding = recipe_pipeline()

    # Warm both sides (tokenizer loads, caches) and check they agree before timing anything.
    total_tokens = 0
    for body in bodies:
        ours = encode_prompt(render_request(body))
        theirs = encoding.encode(dr.ChatCompletionRequest(body).convert(options).conversation)
        assert ours == list(theirs), "renderers disagree; run the differential tests"
        total_tokens += len(ours)

    def ours_render() -> None:
        for body in bodies:
            render_request(body)

    def ours_encode() -> None:
        for body in bodies:
            encode_prompt(render_request(body))

    def recipe_render() -> None:
        for body in bodies:
            encoding.render_conversation(dr.ChatCompletionRequest(body).convert(options).conversation)

    def recipe_encode() -> None:
        for body in bodies:
            encoding.encode(dr.ChatCompletionRequest(body).convert(options).conversation)

    pipelines = {
        "ours_render": ours_render,
        "recipe_render": recipe_render,
        "ours_render_encode": ours_encode,
        "recipe_render_encode": recipe_encode,
    }
    # Repeats interleaved (each pass runs every pipeline once), best pass kept: load on the
    # machine then slows both sides alike.
    seconds = {name: float("inf") for name in pipelines}
    for _ in range(args.repeats):
        for name, fn in pipelines.items():
            seconds[name] = min(seconds[name], time_best(fn, 1))

    # Where our time goes: cumulative time of the three pipeline stages.
    profiler = cProfile.Profile()
    profiler.runcall(ours_encode)
    stats = pstats.Stats(profiler)
    stage_functions = {
        "request -> conversation (validation)": conversation_from_request,
        "conversation -> prompt text": render_conversation,
        "prompt -> token ids (BPE)": prompt_ids,
    }
    by_code = {(k[0], k[1], k[2]): v for k, v in stats.stats.items()}  # type: ignore[attr-defined]
    stages = {}
    for label, fn in stage_functions.items():
        code = fn.__code__
        entry = by_code.get((code.co_filename, code.co_firstlineno, code.co_name))
        stages[label] = entry[3] if entry else None
    profiled_total = sum(v for v in stages.values() if v)

    n = len(bodies)
    result = {
        "requests": n,
        "prompt_tokens": total_tokens,
        "seconds": seconds,
        "requests_per_s": {k: n / v for k, v in seconds.items()},
        "tokens_per_s": {k: total_tokens / v for k, v in seconds.items()},
        "ratio_ours_over_recipe_time": {
            "render": seconds["ours_render"] / seconds["recipe_render"],
            "render_encode": seconds["ours_render_encode"] / seconds["recipe_render_encode"],
        },
        "ours_stage_share": {k: (v / profiled_total if v else None) for k, v in stages.items()},
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")

    print(f"{n} requests, {total_tokens} prompt tokens\n")
    print("| pipeline | ours req/s | recipe req/s | ours time / recipe time |")
    print("| --- | ---: | ---: | ---: |")
    for stage in ("render", "render_encode"):
        print(
            f"| {stage.replace('_', ' + ')} | {n / seconds['ours_' + stage]:,.0f} "
            f"| {n / seconds['recipe_' + stage]:,.0f} "
            f"| {result['ratio_ours_over_recipe_time'][stage]:.2f}x |"
        )
    print("\nwhere our time goes (cProfile, cumulative):")
    for label, share in result["ours_stage_share"].items():
        print(f"  {label:40s} {share:6.1%}" if share is not None else f"  {label:40s} n/a")


if __name__ == "__main__":
    main()
