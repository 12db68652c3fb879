"""The official renderer (`deepseek-recipe` 0.2.0) wrapped for comparisons.

Both sides return an `Outcome`: the prompt, its special ranges and token ids, or the
rejection's status code (400 for a conversion error, None for an undeserialisable body).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from typing import Any

import deepseek_recipe as dr
from sglang_ds41.encoding import EncodingError, encode_prompt, render_request

from sglang_ds41.assets import TOKENIZER_JSON

IMAGE_SPELLING = "<｜deepseek_image｜>"


@dataclass(frozen=True)
class Outcome:
    prompt: str | None = None
    ranges: tuple[tuple[int, int], ...] = ()
    ids: tuple[int, ...] = ()
    error: str | None = None
    status: int | None = None

    @property
    def rejected(self) -> bool:
        return self.error is not None


@cache
def _wheel() -> tuple[Any, Any]:
    tokens = dr.SpecialTokens(image=IMAGE_SPELLING)
    options = dr.ConversionOptions().with_special_tokens(tokens)
    encoding = dr.DeepseekV41Encoding().with_special_tokens(tokens)
    return options, encoding.with_tokenizer(dr.Tokenizer.from_file(str(TOKENIZER_JSON)))


def wheel_conversation(body: Any) -> Any:
    options, _ = _wheel()
    return dr.ChatCompletionRequest(body).convert(options)


def wheel(body: Any, ids: bool = True) -> Outcome:
    options, encoding = _wheel()
    try:
        converted = dr.ChatCompletionRequest(body).convert(options)
    except dr.ConversionError as error:
        return Outcome(error=str(error), status=error.status_code)
    except (ValueError, TypeError, OverflowError) as error:
        return Outcome(error=str(error), status=None)
    rendered = encoding.render_conversation(converted.conversation)
    token_ids = tuple(encoding.encode(converted.conversation)) if ids else ()
    return Outcome(rendered.prompt, tuple(map(tuple, rendered.special_ranges)), token_ids)


def ours(body: Any, ids: bool = True) -> Outcome:
    try:
        rendered = render_request(body)
    except EncodingError as error:
        return Outcome(error=str(error), status=error.status_code)
    spans = tuple((s.start, s.end) for s in rendered.prompt.special_spans)
    token_ids = tuple(encode_prompt(rendered)) if ids else ()
    return Outcome(rendered.prompt.text, spans, token_ids)


def assert_same(body: Any, ids: bool = True) -> Outcome:
    expected, got = wheel(body, ids), ours(body, ids)
    if expected.rejected or got.rejected:
        assert got.rejected and expected.rejected, f"wheel: {expected.error!r}, ours: {got.error!r}"
        assert got.status == expected.status, f"wheel: {expected.error!r}, ours: {got.error!r}"
        return got
    assert got.prompt == expected.prompt
    assert got.ranges == expected.ranges
    assert got.ids == expected.ids
    return got
