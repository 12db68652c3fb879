"""The one thinking decision of a V4.1 request (plugin/serving/thinking.py), against DeepSeek's API rules."""

from __future__ import annotations

import pytest
from sglang_ds41.encoding import EncodingError, reasoning, render_request

from sglang_ds41.plugin.serving import thinking


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
    def __init__(self, thinking=None, chat_template_kwargs=None, custom_params=None):
        self.thinking, self.chat_template_kwargs = thinking, chat_template_kwargs
        self.custom_params = custom_params


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


@pytest.fixture
def server_args():
    """The runtime context a server publishes (its grammar backend is what a budget needs)."""
    from sglang.srt.runtime_context import get_context

    def published(**args):
        return get_context().override_server_args(model_path="/unused", **args)

    return published


@pytest.mark.parametrize(
    ("field", "kwargs", "env", "expected"),
    [
        (8, None, None, 8),  # the body's field (top-level or in chat_template_kwargs: handle_request)
        (None, {"thinking_token_budget": 9}, None, 9),  # chat_template_kwargs on paths without the body
        (None, None, "64", 64),  # the server default
        (8, None, "64", 8),  # the request wins over the server default
        (None, {"thinking_token_budget": 9}, "64", 9),
        (None, None, None, None),  # none at all: nothing for the scheduler
    ],
)
def test_the_token_budget_goes_to_the_scheduler(monkeypatch, server_args, field, kwargs, env, expected):
    monkeypatch.setenv("SGLANG_DEFAULT_THINKING", "1")
    if env is None:
        monkeypatch.delenv(reasoning.THINKING_TOKEN_BUDGET_ENV, raising=False)
    else:
        monkeypatch.setenv(reasoning.THINKING_TOKEN_BUDGET_ENV, env)
    request = _Request(chat_template_kwargs=kwargs, custom_params={"other": 1})
    with server_args():
        assert thinking.settle(_Serving(), request, token_budget=field) is True
    want = {"other": 1} if expected is None else {"other": 1, thinking.BUDGET_PARAM: expected}
    assert request.custom_params == want


def test_with_thinking_off_no_budget_is_passed_on(monkeypatch, server_args):
    monkeypatch.setenv(reasoning.THINKING_TOKEN_BUDGET_ENV, "64")
    request = _Request(thinking={"type": "disabled"})
    with server_args():
        assert thinking.settle(_Serving(), request, token_budget=8) is False
    assert request.custom_params is None


@pytest.mark.parametrize("env", ["0", "-3", "lots"])
def test_a_bad_server_default_is_named(monkeypatch, server_args, env):
    monkeypatch.setenv("SGLANG_DEFAULT_THINKING", "1")
    monkeypatch.setenv(reasoning.THINKING_TOKEN_BUDGET_ENV, env)
    with server_args(), pytest.raises(EncodingError, match=f"{reasoning.THINKING_TOKEN_BUDGET_ENV} must be"):
        thinking.settle(_Serving(), _Request())


def test_a_budget_needs_the_xgrammar_backend(monkeypatch, server_args):
    monkeypatch.setenv("SGLANG_DEFAULT_THINKING", "1")
    monkeypatch.delenv(reasoning.THINKING_TOKEN_BUDGET_ENV, raising=False)
    refused = pytest.raises(EncodingError, match="--grammar-backend outlines")
    with server_args(grammar_backend="outlines"), refused:
        thinking.settle(_Serving(), _Request(), token_budget=8)
