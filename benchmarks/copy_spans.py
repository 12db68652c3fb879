"""Is a copied value a copy of ids? The corpus's copied values, tokenised where they are written.

The corpus asks the model to copy every value it writes from the prompt (docs/TRAINING.md
§2.2). A copying (induction) circuit copies *ids*: it can write a value only if the value's ids
in the turn are a contiguous run of the prompt's ids. Byte-level BPE splits a value by what
surrounds it, so "What is the weather in Richmond?" holds the one id `ĠRichmond` while the
call's DSML parameter `string="true">Richmond<` holds `Rich`, `mond`: the model has to spell the
word again, which no copying circuit does and only memory of that word's spellings can.

For conversations drawn from the corpus (`training.corpus.tasks.draw`) of both entity splits,
this script takes every leaf of every tool call's arguments and of every JSON answer whose text
occurs in the prompt (a user or tool message), finds the ids it has in the assistant turn as
the server encodes it, and reports by kind of value:

* `aligned`: the value has ids of its own in the turn (no id also holds a character around it,
  as `"P` would); the others cannot be copied as ids either;
* `span`: those ids are a contiguous run of the turn's prompt ids (an id copy can write it);
* `live`: every one of those ids has a trained row in the shipped model (`--bundle`), so the
  model can write it at all (ids the corpus never used have an all-zero row, docs/TRAINING.md
  §3.3).

    python benchmarks/copy_spans.py --conversations 400
"""

from __future__ import annotations

import argparse
import json
import random
import re
from collections import defaultdict
from pathlib import Path
from typing import Any

import torch
from sglang_ds41.encoding.prompt_ids import text_tokenizer
from sglang_ds41.encoding.request import conversation_from_request

from sglang_ds41.checkpoint import trained
from sglang_ds41.training.corpus.pools import HELD_OUT, SPLITS, Pools
from sglang_ds41.training.corpus.samples import turns
from sglang_ds41.training.corpus.tasks import FAMILIES, draw
from sglang_ds41.training.evaluate import leaves, value_kind

RESULTS = Path(__file__).resolve().parent / "results" / "copy_spans.json"
BUNDLE = Path(__file__).resolve().parents[1] / "sglang_ds41" / "assets" / "tiny-trained"


def token_spans(ids: list[int]) -> tuple[str, list[tuple[int, int]]]:
    """The decoded text of `ids` and each id's character range in it (by decoding growing
    prefixes)."""
    tok = text_tokenizer()
    text, spans = "", []
    for k in range(len(ids)):
        start, text = len(text), tok.decode(ids[: k + 1], skip_special_tokens=False)
        spans.append((start, len(text)))
    return text, spans


def value_ids(completion: list[int], value: str) -> list[list[int]]:
    """The id runs of `completion` that spell `value` exactly (token boundaries at both ends)."""
    text, spans = token_spans(completion)
    starts: dict[int, int] = {}
    ends: dict[int, int] = {}
    for k, (s, e) in enumerate(spans):
        if e > s:  # ids that decode to nothing (special tokens) bound no value
            starts.setdefault(s, k)
            ends[e] = k
    runs = []
    for m in re.finditer(re.escape(value), text):
        first, last = starts.get(m.start()), ends.get(m.end())
        runs.append(completion[first : last + 1] if first is not None and last is not None else [])
    return runs


def contains(seq: list[int], run: list[int]) -> bool:
    n = len(run)
    return any(seq[i : i + n] == run for i in range(len(seq) - n + 1))


def copied_values(body: dict[str, Any]) -> list[list[str]]:
    """For each assistant message, the leaves of its calls' arguments and JSON answer that occur
    in a user or tool message before it."""
    out, seen = [], ""
    for message in body["messages"]:
        if message["role"] in ("user", "tool"):
            seen += "\n" + str(message["content"])
        if message["role"] != "assistant":
            continue
        found: list[str] = []
        for call in message.get("tool_calls") or []:
            found += leaves(json.loads(call["function"]["arguments"]))
        if body.get("response_format") and message.get("content"):
            found += leaves(json.loads(message["content"]))
        out.append([v for v in found if v and v in seen])
    return out


def live_ids(bundle: Path) -> set[int]:
    """The ids with a trained embedding row (every other row is the all-zero fill)."""
    embed = trained.bundled_tensors(bundle)["embed.weight"]
    return set(torch.nonzero(embed.float().abs().sum(dim=1)).flatten().tolist())


def measure(conversations: int, seed: int, live: set[int]) -> dict[str, Any]:
    counts: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    examples: dict[str, list[dict[str, Any]]] = defaultdict(list)
    families = [f for f in FAMILIES if f != "repeat"]  # repeat answers in plain text: nothing to count
    for split in SPLITS:
        rng, pools = random.Random(seed), Pools(split)
        for i in range(conversations):
            dialogue = draw(rng, pools, families[i % len(families)])
            pairs = turns(conversation_from_request(dialogue.body))
            for (prompt, completion), values in zip(pairs, copied_values(dialogue.body), strict=True):
                for value in values:
                    runs = value_ids(completion, value)
                    if not runs:  # written escaped (a JSON string's quotes, say): not this value's text
                        continue
                    run, kind = runs[0], value_kind(value)
                    span = bool(run) and contains(prompt, run)
                    row = counts[f"{split}/{kind}"]
                    row["values"] += 1
                    row["aligned"] += bool(run)
                    row["span"] += span
                    row["live"] += bool(run) and all(i in live for i in run)
                    if split == HELD_OUT and run and not span and len(examples[kind]) < 3:
                        tok = text_tokenizer()
                        examples[kind].append(
                            {
                                "value": value,
                                "in_prompt": prompt_pieces(prompt, value),
                                "in_turn": [tok.id_to_token(i) for i in run],
                            }
                        )
    return {"counts": {k: dict(v) for k, v in sorted(counts.items())}, "examples": dict(examples)}


def prompt_pieces(prompt: list[int], value: str) -> list[str]:
    """The prompt's tokens that cover the first occurrence of `value` (for the examples)."""
    tok = text_tokenizer()
    text, spans = token_spans(prompt)
    at = text.find(value)
    if at < 0:
        return []
    return [tok.id_to_token(prompt[k]) for k, (s, e) in enumerate(spans) if e > at and s < at + len(value)]


def table(result: dict[str, Any]) -> str:
    lines = [
        "| split / kind | values | own ids in the turn | a span of the prompt | all ids live |",
        "|---|---|---|---|---|",
    ]
    for key, row in result["counts"].items():
        n = row["values"]
        cells = " | ".join(f"{row[c] / n:.1%}" for c in ("aligned", "span", "live"))
        lines.append(f"| {key} | {n} | {cells} |")
    for k, rows in result["examples"].items():
        for e in rows:
            lines.append(f"\n{k}: {e['value']!r}: prompt {e['in_prompt']} -> turn {e['in_turn']}")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--conversations", type=int, default=400, help="per split (families in turn)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--bundle", type=Path, default=BUNDLE, help="whose live rows count as writable")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    result = measure(args.conversations, args.seed, live_ids(args.bundle))
    result["settings"] = {"conversations": args.conversations, "seed": args.seed, "bundle": str(args.bundle)}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2))
    print(table(result))
    print(f"\nwrote {args.out}")


if __name__ == "__main__":
    main()
