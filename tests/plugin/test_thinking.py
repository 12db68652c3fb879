"""The one thinking decision of a V4.1 request (plugin/thinking.py), against DeepSeek's API rules."""

from __future__ import annotations

import pytest
from sglang_ds41.encoding import EncodingError, render_request

from sglang_ds41.plugin import thinking


@pytest.mark.parametrize(
    ("field", "kwargs", "server", "default", "expected"),
    [
        (None, None, None, True, True),  # nothing: the server default (serve: on)
        (None, None, None, False, False),
        ({"type": "enabled"}, None, None, False, True),
        ({"type": "adaptive"}, None, None, False, True),
        ({"type": "disabled"}, None, None, True, False),
        # DeepSeek's field wins over SGLang's kwargs (which SGLang also sets from reasoning_effort)
        ({"type": "disabled"}, {"thinking": True}, None, True, False),
        ({"type": "enabled"}, {"thinking": False}, None, False, True),
        (None, {"thinking": False}, None, True, False),  # reasoning_effort "none" lands here
        (None, {"thinking": True}, {"thinking": False}, False, True),
        (None, {}, {"thinking": False}, True, False),  # --default-chat-template-kwargs
        (None, {"thinking": None}, None, True, True),
    ],
)
def test_decide(field, kwargs, server, default, expected):
    assert thinking.decide(field, kwargs, server, default)[0] is expected


@pytest.mark.parametrize("field", [{"type": "on"}, {"budget_tokens": 5}, True, "enabled", []])
def test_a_bad_thinking_field_is_refused_as_the_renderer_refuses_it(field):
    with pytest.raises(EncodingError) as served:
        thinking.decide(field, None, None, True)
    with pytest.raises(EncodingError) as rendered:
        render_request({"model": "DeepSeek-V4.1-Flash", "messages": [{"role": "user", "content": "hi"}],
                        "thinking": field})
    assert str(served.value) == str(rendered.value) and "thinking" in str(served.value)


def test_reasoning_budget():
    assert thinking.budget_from_body({"reasoning_budget": 30}) == 30
    assert thinking.budget_from_body({"reasoning_budget": None}) is None
    assert thinking.budget_from_body({}) is None
    for bad in (0, 101, 2.5, "30", True):
        with pytest.raises(EncodingError, match="reasoning_budget must be an integer from 1 to 100"):
            thinking.budget_from_body({"reasoning_budget": bad})


class _Request:
    def __init__(self, thinking=None, chat_template_kwargs=None):
        self.thinking, self.chat_template_kwargs = thinking, chat_template_kwargs


class _Serving:
    chat_encoding_spec, reasoning_parser, default_chat_template_kwargs = "dsv41", "deepseek-v41", None


def test_settle_writes_the_decision_and_the_budget_where_sglang_reads_them(monkeypatch):
    monkeypatch.setenv("SGLANG_DEFAULT_THINKING", "1")
    request = _Request(chat_template_kwargs={"x": 1})
    assert thinking.settle(_Serving(), request, 30) is True
    assert request.chat_template_kwargs == {"x": 1, "thinking": True, "reasoning_effort": 30}
    off = _Request(thinking={"type": "disabled"})
    with pytest.raises(EncodingError, match=r"thinking is off \(thinking.type is disabled\)"):
        thinking.settle(_Serving(), off, 30)
    assert thinking.settle(_Serving(), off) is False and off.chat_template_kwargs == {"thinking": False}


def test_only_v41_servers_are_touched():
    assert thinking.serves_v41(_Serving())
    other = _Serving()
    other.chat_encoding_spec = "dsv4"
    assert not thinking.serves_v41(other)
