"""Conversations -> token ids and the positions the loss is taken on.

Each assistant turn is learnt as the model will produce it when served: the request's
messages up to that turn are rendered and encoded as the server does (`encoding`), then the
turn's own ids (`render_completion`: reasoning, `</think>`, content, DSML calls, EOS) follow
the generation header; the loss covers exactly those ids.

A conversation with several turns becomes one sequence when every turn's prompt is a prefix
of the next (a thinking conversation with tools keeps its reasoning in the history,
ENCODING.md §2.4); otherwise (a multi-turn chat whose history drops the reasoning) each turn
is a sequence of its own.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass

from sglang_ds41.encoding import encode_prompt, render_completion, render_conversation
from sglang_ds41.encoding.conversation import AssistantMessage, Conversation
from sglang_ds41.encoding.request import conversation_from_request

from .tasks import Dialogue


@dataclass(frozen=True)
class Sample:
    """One training sequence: `ids`, and `learn[i]` true where ids[i] is a target (predicted
    from ids[:i])."""

    family: str
    ids: tuple[int, ...]
    learn: tuple[bool, ...]

    def __len__(self) -> int:
        return len(self.ids)


def packed(family: str, bos: int, length: int, draw: Callable[[], tuple[list[int], list[bool]]]) -> Sample:
    """BOS, then pieces from `draw` (ids, learnt flags) until the next would pass `length` ids;
    the first piece is always kept, so a drill is never empty."""
    ids, learn = [bos], [False]
    while True:
        more, more_learn = draw()
        if len(ids) > 1 and len(ids) + len(more) > length:
            return Sample(family, tuple(ids), tuple(learn))
        ids += more
        learn += more_learn


def turns(conv: Conversation) -> list[tuple[list[int], list[int]]]:
    """(prompt ids, completion ids) of every assistant turn of a conversation."""
    out = []
    for k, message in enumerate(conv.messages):
        if isinstance(message, AssistantMessage):
            prompt = encode_prompt(render_conversation(dataclasses.replace(conv, messages=conv.messages[:k])))
            out.append((prompt, encode_prompt(render_completion(message, conv.thinking))))
    return out


def samples(dialogue: Dialogue) -> list[Sample]:
    conv = conversation_from_request(dialogue.body)
    pairs = turns(conv)
    joined: list[int] = []
    learn: list[bool] = []
    for prompt, completion in pairs:
        if joined and prompt[: len(joined)] != joined:
            break
        learn += [False] * (len(prompt) - len(joined)) + [True] * len(completion)
        joined = prompt + completion
    else:
        return [Sample(dialogue.family, tuple(joined), tuple(learn))]
    return [
        Sample(dialogue.family, tuple(p + c), tuple([False] * len(p) + [True] * len(c))) for p, c in pairs
    ]
