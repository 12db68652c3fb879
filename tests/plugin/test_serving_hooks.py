"""The serving hooks are in place after `load_plugins()`, and leave every other model to SGLang."""

from __future__ import annotations

import pkgutil
from types import SimpleNamespace

import pytest

from sglang_ds41.plugin.serving import parsers, thinking

TARGETS = sorted({**parsers.HOOKS, **thinking.HOOKS})


@pytest.fixture(scope="module")
def loaded():
    from sglang.srt.plugins import load_plugins

    load_plugins()


@pytest.mark.parametrize("target", TARGETS)
def test_each_target_is_wrapped_around_upstream(loaded, target):
    hooked = pkgutil.resolve_name(target)
    assert hooked.__wrapped__.__module__.startswith("sglang.srt.")
    assert hooked.__name__ == target.rsplit(".", 1)[1]


def _calls_original(hook, obj, *args, **kwargs):
    seen = []

    def original(*a, **k):
        seen.append((a, k))
        return "upstream"

    assert hook(original, obj, *args, **kwargs) == "upstream"
    assert seen == [((obj, *args), kwargs)]


@pytest.mark.parametrize(
    "adapter",
    [
        SimpleNamespace(_spec="dsv4", _token_output=True),  # DeepSeek-V4: recipe's parser as before
        SimpleNamespace(_spec="dsv41", _token_output=False),  # V4.1 with other parsers: the text path
    ],
)
def test_other_adapters_keep_upstreams_parser(adapter):
    assert not parsers.ours(adapter)
    _calls_original(parsers.parse_chat_response, adapter, request=None, output_ids=[], finish_reason={})
    _calls_original(parsers.stream_chat_chunks, adapter, content={}, index=0)


@pytest.mark.parametrize(
    "serving",
    [
        SimpleNamespace(chat_encoding_spec=None, reasoning_parser="qwen3"),
        SimpleNamespace(chat_encoding_spec="dsv41", reasoning_parser=None),
    ],
)
def test_other_servers_keep_upstreams_thinking(serving):
    request = SimpleNamespace(thinking={"type": "bogus"}, chat_template_kwargs=None)
    _calls_original(thinking.process_messages, serving, request)
    _calls_original(thinking.handle_request, serving, request, None)
    assert request.chat_template_kwargs is None


def test_a_response_without_flagged_calls_is_upstreams_own_object():
    response = object()
    assert parsers.build_chat_response(lambda *a, **k: response, None, "request", [], 0) is response
