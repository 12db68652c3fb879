"""SGLang's V4.1 chat encoding adapter outside a server, for the tests and benchmarks that drive
its `encode_messages` and parsers directly (with the plugin loaded, its hooks act on it)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any


def recipe_chat_adapter(tokenizer: Any = None) -> Any:
    """A `DeepSeekRecipeChatEncodingAdapter` for the V4.1 spec, built as `OpenAIServingChat`
    builds it (its hooks bound to a stand-in handler carrying the fields they read), on
    `tokenizer` (a `PreTrainedTokenizerFast`; default: a new one of the V4.1 tokenizer)."""
    from sglang.srt.entrypoints.openai.chat_encoding_adapters import ChatOutputHooks
    from sglang.srt.entrypoints.openai.serving_chat import OpenAIServingChat
    from sglang.srt.entrypoints.openai.serving_deepseek_recipe import DeepSeekRecipeChatEncodingAdapter

    if tokenizer is None:
        from sglang_ds41.assets import v41_hf_tokenizer

        tokenizer = v41_hf_tokenizer()
    handler = SimpleNamespace(tool_call_parser="deepseekv41")
    hooks = ChatOutputHooks(
        thinking_requested=lambda request: OpenAIServingChat._thinking_requested(handler, request),
        tool_call_parsing_active=lambda request: bool(request.tools) and request.tool_choice != "none",
        history_tool_calls_count=lambda r: OpenAIServingChat._get_history_tool_calls_cnt(handler, r),
        tool_call_id=lambda item, count: OpenAIServingChat._process_tool_call_id(handler, item, count),
    )
    return DeepSeekRecipeChatEncodingAdapter(
        chat_encoding_spec="dsv41",
        tokenizer=tokenizer,
        reasoning_parser="deepseek-v41",
        tool_call_parser="deepseekv41",
        chat_hooks=hooks,
        default_chat_template_kwargs=None,
    )
