"""RenderedPrompt -> token ids ("prompt encoding", ENCODING.md §1.3).

Special spans become their single ids; every run of text between them goes through the BPE
*without* the added vocabulary, so a user who types `<｜Assistant｜>` gets ordinary pieces, not
the control token. The tokenizer used for text runs is the V4.1 tokenizer with its
`added_tokens` list emptied (normalizer, pre-tokenizer and BPE model unchanged), run through
`text_bpe.TextEncoder` (the same ids, faster).
"""

from __future__ import annotations

import functools
import json
import weakref
from typing import TYPE_CHECKING

from .render import RenderedPrompt
from .text_bpe import TextEncoder

if TYPE_CHECKING:
    from tokenizers import Tokenizer


_TEXT_TOKENIZERS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_TEXT_ENCODERS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def text_tokenizer_of(tokenizer: Tokenizer) -> Tokenizer:
    """`tokenizer` minus its added vocabulary (normalizer, pre-tokenizer and BPE model
    unchanged), built once per tokenizer object."""
    found = _TEXT_TOKENIZERS.get(tokenizer)
    if found is None:
        from tokenizers import Tokenizer

        spec = json.loads(tokenizer.to_str())
        spec["added_tokens"] = []
        found = _TEXT_TOKENIZERS[tokenizer] = Tokenizer.from_str(json.dumps(spec))
    return found


def text_encoder_of(tokenizer: Tokenizer) -> TextEncoder:
    """The text-run encoder of `tokenizer` (its BPE without the added vocabulary), built once
    per tokenizer object."""
    found = _TEXT_ENCODERS.get(tokenizer)
    if found is None:
        found = _TEXT_ENCODERS[tokenizer] = TextEncoder(text_tokenizer_of(tokenizer))
    return found


def text_tokenizer() -> Tokenizer:
    """The V4.1 tokenizer minus its added vocabulary."""
    from sglang_ds41.assets import v41_tokenizer

    return text_tokenizer_of(v41_tokenizer())


@functools.cache
def _v41_text_encoder() -> TextEncoder:
    from sglang_ds41.assets import v41_tokenizer

    return text_encoder_of(v41_tokenizer())


def encode_text(text: str) -> list[int]:
    return list(_v41_text_encoder().encode(text))


def prompt_ids(prompt: RenderedPrompt, encoder: TextEncoder | None = None) -> list[int]:
    """`prompt`'s ids; `encoder` encodes its text runs (default: the V4.1 tokenizer's)."""
    encode = (encoder or _v41_text_encoder()).encode
    ids: list[int] = []
    start = 0
    text = prompt.text
    for span in prompt.special_spans:
        if span.start > start:
            ids += encode(text[start : span.start])
        ids.append(span.token.id)
        start = span.end
    ids += encode(text[start:])
    return ids
