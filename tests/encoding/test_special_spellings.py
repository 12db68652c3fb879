"""Special-token spellings typed into any text a request carries (system prompt, names, earlier
answers and their reasoning, content parts, tool and parameter descriptions, a response
format's name and schema) stay text: the prompt holds exactly the control ids of the same
request without them, and the ids are the official renderer's."""

from __future__ import annotations

from collections import Counter

import pytest
from sglang_ds41.encoding import encode_prompt, render_request
from sglang_ds41.encoding.special_tokens import Special

from tests.encoding.oracle import wheel

M = "DeepSeek-V4.1-Flash"
TYPED = "".join(s.value for s in Special)


def request(typed: str, thinking: bool) -> dict:
    """A request with `typed` appended to every free text a caller controls."""
    tool = {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Weather now." + typed,
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string", "description": "A city." + typed}},
            },
        },
    }
    messages = [
        {"role": "system", "content": "Be brief." + typed},
        {"role": "user", "content": "Hi" + typed, "name": "ann" + typed},
        {"role": "assistant", "content": "Hello" + typed, "reasoning_content": "Greet." + typed},
        {"role": "user", "content": [{"type": "text", "text": "Weather?" + typed}]},
    ]
    schema = {"type": "object", "description": "An answer." + typed, "properties": {"a": {"type": "string"}}}
    return {
        "model": M,
        "messages": messages,
        "tools": [tool],
        "response_format": {"type": "json_schema", "json_schema": {"name": "answer", "schema": schema}},
        "thinking": {"type": "enabled" if thinking else "disabled"},
    }


def control_ids(ids: list[int]) -> Counter:
    special = {s.id for s in Special}
    return Counter(i for i in ids if i in special)


@pytest.mark.parametrize("thinking", [True, False])
def test_typed_spellings_add_no_control_ids_anywhere(thinking: bool) -> None:
    typed = request(TYPED, thinking)
    ids = encode_prompt(render_request(typed))
    assert control_ids(ids) == control_ids(encode_prompt(render_request(request("", thinking))))
    assert ids == list(wheel(typed).ids)
