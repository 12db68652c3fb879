"""RenderedPrompt -> token ids ("prompt encoding", ENCODING.md §1.3).

Special spans become their single ids; every run of text between them goes through the BPE
*without* the added vocabulary, so a user who types `<｜Assistant｜>` gets ordinary pieces, not
the control token. The tokenizer used for text runs is the V4.1 tokenizer with its
`added_tokens` list emptied (normalizer, pre-tokenizer and BPE model unchanged).
"""

from __future__ import annotations

import json
import weakref
from typing import TYPE_CHECKING

from .render import RenderedPrompt

if TYPE_CHECKING:
    from tokenizers import Tokenizer


_TEXT_TOKENIZERS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


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


def text_tokenizer() -> Tokenizer:
    """The V4.1 tokenizer minus its added vocabulary."""
    from sglang_ds41.assets import v41_tokenizer

    return text_tokenizer_of(v41_tokenizer())


def encode_text(text: str) -> list[int]:
    if not text:
        return []
    return text_tokenizer().encode(text, add_special_tokens=False).ids


def prompt_ids(prompt: RenderedPrompt) -> list[int]:
    ids: list[int] = []
    start = 0
    for span in prompt.special_spans:
        ids.extend(encode_text(prompt.text[start : span.start]))
        ids.append(span.token.id)
        start = span.end
    ids.extend(encode_text(prompt.text[start:]))
    return ids
