"""Our `reasoning_budget` extension and the guarantee that typed special spellings stay text."""

from __future__ import annotations

import pytest
from sglang_ds41.encoding import EncodingError, encode_prompt, render_request
from sglang_ds41.encoding.prompt_ids import encode_text
from sglang_ds41.encoding.special_tokens import Special

from tests.encoding.oracle import wheel

M = "DeepSeek-V4.1-Flash"
WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}


def body(**extra: object) -> dict:
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"}]
    return {"model": M, "messages": messages, "tools": [WEATHER], **extra}


@pytest.mark.parametrize("budget", [1, 9, 33, 75, 100])
def test_budget_equals_the_official_high_prompt_with_the_number_replaced(budget: int) -> None:
    official = wheel(body(), ids=False).prompt
    expected = official.replace("Reasoning Effort: 75 (", f"Reasoning Effort: {budget} (", 1)
    rendered = render_request(body(reasoning_budget=budget))
    assert f"Reasoning Effort: {budget} (range 1-100" in rendered.prompt.text
    assert rendered.prompt.text == expected


def test_budget_ids_replace_only_the_number_tokens() -> None:
    official = wheel(body(), ids=True).ids
    seventy_five, forty_two = encode_text("75"), encode_text("42")
    ids = encode_prompt(render_request(body(reasoning_budget=42)))
    at = next(i for i in range(len(official)) if list(official[i : i + len(seventy_five)]) == seventy_five)
    assert ids == list(official[:at]) + forty_two + list(official[at + len(seventy_five) :])


@pytest.mark.parametrize("budget", [0, 101, -5, 50.0, True, "50", None])
def test_out_of_range_or_non_integer_budget_is_rejected(budget: object) -> None:
    if budget is None:
        render_request(body(reasoning_budget=budget))  # null means "not given"
        return
    with pytest.raises(EncodingError, match="reasoning_budget"):
        render_request(body(reasoning_budget=budget))


def test_budget_with_thinking_disabled_is_rejected() -> None:
    with pytest.raises(EncodingError, match=r"thinking is off \(thinking.type is disabled\)"):
        render_request(body(reasoning_budget=50, thinking={"type": "disabled"}))


SPELLINGS = [Special.ASSISTANT, Special.DSML, Special.EOS, Special.IMAGE, Special.USER, Special.THINK_END]


def test_special_spellings_typed_in_user_and_tool_text_never_become_special_ids() -> None:
    typed = "x" + "".join(s.value for s in SPELLINGS) + "y"
    call = {"id": "c", "type": "function", "function": {"name": "get_weather", "arguments": "{}"}}
    messages = [
        {"role": "user", "content": typed},
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "c", "content": typed},
    ]
    request = {"model": M, "messages": messages, "tools": [WEATHER], "thinking": {"type": "disabled"}}
    rendered = render_request(request)
    ids = encode_prompt(rendered)
    assert ids == list(wheel(request).ids)
    # The template itself uses the DSML id and one Assistant id per turn; typed text adds none.
    assert Special.IMAGE.id not in ids and Special.EOS.id in ids
    assert ids.count(Special.ASSISTANT.id) == 2
    assert ids.count(Special.USER.id) == 2
    text_ids = encode_text(typed)
    assert not set(text_ids) & {s.id for s in Special}
