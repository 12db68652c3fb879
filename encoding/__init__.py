"""The DeepSeek-V4.1 prompt format, imported as `sglang_ds41.encoding`.

(This folder sits at the repository root, not under `sglang_ds41/`: pyproject.toml's
`package-dir` installs it as `sglang_ds41.encoding`, so every import of it, here and in the
other packages, is spelled `sglang_ds41.encoding` (or relative); README, Layout, says why.)

A pipeline of pure stages, byte-exact with the official renderer `deepseek-recipe`:
OpenAI chat request -> Conversation -> RenderedPrompt (text + special spans) -> token ids;
and the way back: completion text or ids -> reasoning / content / tool calls.

Public API (rendering side):

* `render_request(body)` -> `RenderedRequest`: validates an OpenAI Chat Completions body (a
  dict, or JSON text parsed with serde number semantics) and renders the V4.1 prompt; a
  request the official renderer refuses raises `EncodingError`.
* `encode_prompt(rendered)` -> token ids (special spans as single ids, text without the added
  vocabulary).
* `render_completion(message, thinking)` -> what the model writes for an assistant message after
  the generation header (the targets of training, `sglang_ds41.training`).

Our one request extension: `"reasoning_budget": N` (integer 1-100) puts N in the
`Reasoning Effort: N (range 1-100, ...)` line instead of the named tier's 50/75/100. It
requires thinking mode (an error when thinking is disabled) and overrides `reasoning_effort`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .conversation import AssistantMessage, Conversation, ParsingOptions
from .errors import EncodingError
from .prompt_ids import prompt_ids
from .render import RenderedPrompt, prefix_closes_reasoning, render_completion, render_conversation
from .request import conversation_from_request

__all__ = [
    "Conversation",
    "EncodingError",
    "ParsingOptions",
    "RenderedPrompt",
    "RenderedRequest",
    "encode_prompt",
    "parsing_options",
    "render_completion",
    "render_conversation",
    "render_request",
]


@dataclass(frozen=True)
class RenderedRequest:
    """A rendered prompt plus what the output parser needs to start in the right state."""

    prompt: RenderedPrompt
    conversation: Conversation
    parsing: ParsingOptions


def parsing_options(conv: Conversation) -> ParsingOptions:
    """Where output parsing starts for this conversation (ENCODING.md §2.5, §2.11)."""
    last = conv.messages[-1] if conv.messages else None
    prefix = isinstance(last, AssistantMessage) and last.prefix
    # A continued turn rendered `</think>` + content (see prefix_closes_reasoning) starts in
    # content even when reasoning_content was given. (The official renderer's own parsing
    # options say ReasoningContinuation there, contradicting its prompt.)
    closed = prefix_closes_reasoning(conv)
    in_content = bool(prefix and conv.thinking and (last.content or closed))
    reasoning_started = bool(prefix and conv.thinking and not in_content and last.reasoning_content)
    tools = bool(conv.tools)
    return ParsingOptions(
        thinking=conv.thinking,
        reasoning_started=reasoning_started,
        in_content=in_content,
        parse_tool_calls=tools,
        starts_in_tool_calls=tools and conv.tool_choice == "required",
        parse_json_output=conv.response_format == "json_object",
    )


def render_request(body: dict[str, Any] | str | bytes) -> RenderedRequest:
    conv = conversation_from_request(body)
    return RenderedRequest(render_conversation(conv), conv, parsing_options(conv))


def encode_prompt(rendered: RenderedRequest | RenderedPrompt) -> list[int]:
    prompt = rendered.prompt if isinstance(rendered, RenderedRequest) else rendered
    return prompt_ids(prompt)


# ---------------------------------------------------------------------------------------------
# Parsing side (output -> reasoning / content / tool calls): see parse.py for the differences
# from the official parser.

from .parse import parse_ids, parse_text  # noqa: E402
from .parsed import ParsedMessage, ParsedToolCall  # noqa: E402
from .stream import StreamParser, seeded_tool_call_ids  # noqa: E402

__all__ += [
    "ParsedMessage",
    "ParsedToolCall",
    "StreamParser",
    "parse_ids",
    "parse_text",
    "seeded_tool_call_ids",
]
