"""Name drills: the spelling of a word taught where a call writes it, not among filler words.

A spelling drill (`spelling.py`) teaches the space-free spelling of the vocabulary's capitalised
words with lower-case filler words between the word and its spelling; measured on calls
(`benchmarks/name_writing.py`), that table did not carry over: words spelt right after `">` on
drills 36-65% of the time were written right in a call 3% of the time (docs/TRAINING.md §7). In a
call, what stands between the question's name and the value is the chat template and DSML
(`<｜Assistant｜>`, `</think>`, `invoke`, `name="city"`), the reasoning's own copy of the name
with its space, and other calls' values.

A name drill is that layout, drawn by the corpus itself: the first assistant turn of a
conversation of a family whose turn carries names (`FAMILIES`: weather calls, bank tool calls,
JSON answers), with every name in it a capitalised word of the vocabulary (with a piece after it
30% of the time; `Pools(real_names=False, vocabulary_names=1.0)`), cut from the last
`<｜User｜>` of its prompt so that the tools' system text, the same in every call, is not paid
for. The whole turn is learnt, as in the corpus. Several such cuts follow BOS in one drill,
like conversations of turns, until the next would pass the drill's length (at least one).
"""

from __future__ import annotations

import random

from sglang_ds41.encoding.request import conversation_from_request
from sglang_ds41.encoding.special_tokens import Special

from .corpus.pools import TRAIN, Pools
from .corpus.samples import Sample, packed, turns
from .corpus.tasks import draw

FAMILIES = ("weather", "tool", "json")  # families whose first assistant turn writes names
NAME_POOLS = Pools(TRAIN, vocabulary_names=1.0, real_names=False)


def call_cut(rng: random.Random) -> tuple[list[int], list[bool]]:
    """The last user turn and the first assistant turn of one drawn conversation, and which of
    those ids are learnt (the assistant turn's)."""
    dialogue = draw(rng, NAME_POOLS, family=rng.choice(FAMILIES))
    prompt, turn = turns(conversation_from_request(dialogue.body))[0]
    user = len(prompt) - 1 - prompt[::-1].index(Special.USER.id)
    asked = prompt[user:]
    return asked + turn, [False] * len(asked) + [True] * len(turn)


def name_drill(rng: random.Random, bos: int, length: int) -> Sample:
    """BOS, then call cuts until the next would pass `length` ids (the first is always kept)."""
    return packed("names", bos, length, lambda: call_cut(rng))
