"""Can the model write a name it never saw into a call? Teacher-forced, id by id.

The greedy evaluation (`tiny_eval.py`) says whether a whole call came out right; when it did
not, it cannot say whether the model failed to decide on the call or to write the name in it.
This benchmark asks only the second: it gives the reference model a weather question and the
right `get_weather` call up to the name (thinking off, as a third of the corpus's turns are),
and checks whether each id of the name, written without its space (`ĠRichmond` in the question
is `Rich`, `mond` in the call: docs/TRAINING.md §7), is the model's top prediction after the ids
before it. `first id` needs the word's space-free spelling (what the spelling drills teach);
`every id` also needs the copying of the rest.

Groups: held-out real cities, held-out made-up names (`corpus.pools`, split `held_out`),
training-split cities as the control, and words of the spelling drills' table
(`training/spelling.py`): whether what the drills teach is used in a call.

    python benchmarks/name_writing.py [--model-dir DIR] [--names 30]
"""

from __future__ import annotations

import argparse
import json
import random
import time
from pathlib import Path
from typing import Any

import torch
from sglang_ds41.encoding.prompt_ids import text_tokenizer
from sglang_ds41.encoding.request import conversation_from_request

from sglang_ds41.training.corpus.pools import HELD_OUT, TRAIN, Pools, split_cities
from sglang_ds41.training.corpus.samples import turns
from sglang_ds41.training.corpus.tasks import MODEL
from sglang_ds41.training.corpus.toolbank import CALCULATE, GET_WEATHER
from sglang_ds41.training.spelling import spelt_words

RESULTS = Path(__file__).resolve().parent / "results" / "name_writing.json"
QUESTIONS = ("What is the weather in {}?", "How warm is it in {} right now?")


def groups(seed: int, n: int) -> dict[str, list[str]]:
    rng = random.Random(seed)
    held = Pools(HELD_OUT)
    return {
        "held-out cities": rng.sample(list(split_cities(HELD_OUT)), n),
        "held-out made-up names": [held.made_up_name(rng) for _ in range(n)],
        "training cities": rng.sample(list(split_cities(TRAIN)), n),
        "drilled words": rng.sample(drilled_words(), n),
    }


def drilled_words() -> list[str]:
    """The vocabulary's capitalised words of 4+ letters, one id with their space: the words
    whose space-free spelling the spelling drills teach, so this group asks whether that table
    reaches a call at all."""
    tok = text_tokenizer()
    spaced = (tok.id_to_token(i) for i, _ in spelt_words())
    return [token[1:] for token in spaced if len(token) > 4]


def call_ids(name: str, question: str) -> tuple[list[int], int, list[int]]:
    """The ids of the question and the call's turn as the server encodes them, where the name
    starts in them, and the name's ids there."""
    arguments = json.dumps({"city": name})
    call = {"id": "c", "type": "function", "function": {"name": "get_weather", "arguments": arguments}}
    body = {
        "model": MODEL,
        "tools": [GET_WEATHER, CALCULATE],
        "thinking": {"type": "disabled"},
        "messages": [
            {"role": "user", "content": question.format(name)},
            {"role": "assistant", "content": "", "tool_calls": [call]},
            {"role": "tool", "tool_call_id": "c", "content": "{}"},
        ],
    }
    [(prompt, turn)] = turns(conversation_from_request(body))
    spelling = text_tokenizer().encode(name, add_special_tokens=False).ids
    at = next(k for k in range(len(turn)) if turn[k : k + len(spelling)] == spelling)
    return prompt + turn, len(prompt) + at, spelling


def measure(model, names: dict[str, list[str]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    tok = text_tokenizer()
    for group, group_names in names.items():
        first = every = 0
        examples = []
        for k, name in enumerate(group_names):
            ids, at, spelling = call_ids(name, QUESTIONS[k % len(QUESTIONS)])
            with torch.no_grad():
                predicted = model(torch.tensor(ids), model.new_state()).argmax(-1)
            got = [int(predicted[at - 1 + j]) for j in range(len(spelling))]
            right = [g == s for g, s in zip(got, spelling, strict=True)]
            first, every = first + right[0], every + all(right)
            if len(examples) < 3:
                examples.append({"name": name, "top": [tok.id_to_token(i) for i in got], "right": right})
        n = len(group_names)
        out[group] = {"names": n, "first_id": first / n, "every_id": every / n, "examples": examples}
    return out


def table(result: dict[str, Any]) -> str:
    lines = ["| names | n | first id right | every id right |", "|---|---|---|---|"]
    for group, row in result["groups"].items():
        lines.append(f"| {group} | {row['names']} | {row['first_id']:.0%} | {row['every_id']:.0%} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    from sglang_ds41.cache import trained_tiny_checkpoint
    from sglang_ds41.reference.weights import load_reference

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model-dir", type=Path, help="a checkpoint (default: the shipped trained model)")
    parser.add_argument("--names", type=int, default=30, help="names per group")
    parser.add_argument("--seed", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    model_dir = args.model_dir or trained_tiny_checkpoint()
    started = time.perf_counter()
    result = {
        "model_dir": str(model_dir),
        "groups": measure(load_reference(model_dir), groups(args.seed, args.names)),
        "settings": {"names": args.names, "seed": args.seed},
    }
    result["seconds"] = round(time.perf_counter() - started, 1)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2))
    print(table(result))
    print(f"\nwrote {args.out}")


if __name__ == "__main__":
    main()
