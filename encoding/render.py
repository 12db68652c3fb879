"""Conversation -> RenderedPrompt, byte-exact with the official V4.1 renderer (ENCODING.md §2).

The prompt is built as a list of pieces, each plain text or one special token, so that the
special spans (which become single ids) are known exactly; text typed by users that happens
to spell a special token stays plain text and is never given a special id.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from . import json_text
from .conversation import (
    AssistantMessage,
    Conversation,
    ImagePart,
    ImageSource,
    LatestReminderMessage,
    Message,
    Part,
    SystemMessage,
    ToolCall,
    ToolMessage,
    UserMessage,
)
from .special_tokens import Special, SpecialSpan

EFFORT_LINE = "Reasoning Effort: {n} (range 1-100, the higher the value, the more thorough the reasoning)"
D = Special.DSML.value
TOOLS_SECTION = f"""## Tools

You have access to a set of tools to help answer the user's question. You can invoke tools by writing a "<{D} calls>" block like the following:

<{D} calls>
<{D} invoke name="$TOOL_NAME">
<{D} parameter name="$PARAMETER_NAME" string="true|false">$PARAMETER_VALUE</{D} parameter>
...
</{D} invoke>
<{D} invoke name="$TOOL_NAME2">
...
</{D} invoke>
</{D} calls>

String parameters should be specified as is and set `string="true"`. For all other types (numbers, booleans, arrays, objects), pass the value in JSON format and set `string="false"`.

If thinking_mode is enabled (triggered by <think>), you MUST output your complete reasoning inside <think>...</think> BEFORE any tool calls or final response.

Otherwise, output directly after </think> with tool calls or final response.

### Available Tool Schemas

{{tools}}

You MUST strictly follow the above defined tool name and parameter schemas to invoke tool calls.
"""  # noqa: E501
RESPONSE_FORMAT_SECTION = (
    "## Response Format:\n\nYou MUST strictly adhere to the following schema to reply:\n{schema}"
)
# Spellings inside the fixed template text that the renderer emits as special tokens.
_TEMPLATE_SPECIALS = re.compile(
    "|".join(re.escape(s.value) for s in (Special.DSML, Special.THINK_START, Special.THINK_END))
)
_BY_SPELLING = {s.value: s for s in Special}


@dataclass(frozen=True)
class RenderedPrompt:
    """The prompt string, its special-token spans (code-point offsets) and image sources."""

    text: str
    special_spans: tuple[SpecialSpan, ...]
    image_sources: tuple[ImageSource, ...]


class _Builder:
    def __init__(self) -> None:
        self.pieces: list[str] = []
        self.length = 0
        self.spans: list[SpecialSpan] = []
        self.images: list[ImageSource] = []

    def text(self, text: str) -> None:
        self.pieces.append(text)
        self.length += len(text)

    def special(self, token: Special) -> None:
        self.spans.append(SpecialSpan(self.length, self.length + len(token.value), token))
        self.text(token.value)

    def template(self, text: str) -> None:
        """Fixed template text whose DSML/think spellings are special tokens."""
        start = 0
        for match in _TEMPLATE_SPECIALS.finditer(text):
            self.text(text[start : match.start()])
            self.special(_BY_SPELLING[match.group()])
            start = match.end()
        self.text(text[start:])

    def parts(self, parts: tuple[Part, ...] | list[Part]) -> None:
        for i, part in enumerate(parts):
            if i:
                self.text("\n\n")
            if isinstance(part, ImagePart):
                self.images.append(part.source)
                self.special(Special.IMAGE)
            else:
                self.text(part)

    def build(self) -> RenderedPrompt:
        return RenderedPrompt("".join(self.pieces), tuple(self.spans), tuple(self.images))


def render_conversation(conv: Conversation) -> RenderedPrompt:
    out = _Builder()
    out.special(Special.BOS)
    messages = list(conv.messages)
    tools_present = bool(conv.tools)
    json_format = conv.response_format in ("json_object", "json_schema")
    first_is_system = bool(messages) and isinstance(messages[0], SystemMessage)
    if (conv.thinking and messages) or first_is_system or tools_present or json_format:
        _first_block(out, conv, messages.pop(0) if first_is_system else None)

    keep_reasoning = conv.thinking and tools_present
    last_calls: tuple[ToolCall, ...] = ()
    i = 0
    while i < len(messages):
        message = messages[i]
        if isinstance(message, (UserMessage, ToolMessage)):
            j = i
            while j < len(messages) and isinstance(messages[j], (UserMessage, ToolMessage)):
                j += 1
            _user_block(out, messages[i:j], last_calls)
            i = j
            continue
        if isinstance(message, SystemMessage):
            out.special(Special.SYSTEM)
            out.parts(message.parts)
        elif isinstance(message, LatestReminderMessage):
            if not (i and isinstance(messages[i - 1], LatestReminderMessage)):
                out.special(Special.LATEST_REMINDER)
                out.text(message.content)
        elif message.prefix:
            _prefix_turn(out, conv.thinking and not prefix_closes_reasoning(conv), message)
            return out.build()
        else:
            _assistant_turn(out, message, keep_reasoning)
            if message.tool_calls:
                last_calls = message.tool_calls
        i += 1

    out.special(Special.ASSISTANT)
    out.special(Special.THINK_START if conv.thinking else Special.THINK_END)
    if conv.tool_choice == "required" and tools_present:
        out.text("\n\n<")
        out.special(Special.DSML)
        out.text(" calls>\n")
    return out.build()


def prefix_closes_reasoning(conv: Conversation) -> bool:
    """Whether a continued (prefix) turn is rendered `</think>` + content despite thinking.

    The official renderer does this when the continued turn is the only message and the first
    block holds nothing but the effort line (no system text, tools or JSON format).
    """
    json_format = conv.response_format in ("json_object", "json_schema")
    return len(conv.messages) == 1 and not conv.tools and not json_format


def _first_block(out: _Builder, conv: Conversation, system: Message | None) -> None:
    out.special(Special.SYSTEM)
    if conv.thinking:
        out.text(EFFORT_LINE.format(n=conv.reasoning_budget) + "\n\n")
    if isinstance(system, SystemMessage):
        out.parts(system.parts)
    if conv.tools:
        lines = "\n".join(json_text.dumps(_tool_line(tool)) for tool in conv.tools)
        out.text("\n\n")
        head, tail = TOOLS_SECTION.split("{tools}")
        out.template(head)
        out.text(lines)
        out.template(tail)
    if conv.response_format in ("json_object", "json_schema"):
        schema = {"type": "json_object"} if conv.response_format == "json_object" else conv.response_schema
        out.text("\n\n" + RESPONSE_FORMAT_SECTION.format(schema=json_text.dumps(schema)))


def _tool_line(tool: Any) -> dict[str, Any]:
    return {
        "name": tool.name,
        "description": tool.description or "",
        "parameters": {} if tool.parameters is None else tool.parameters,
    }


def _user_block(out: _Builder, run: list[Message], last_calls: tuple[ToolCall, ...]) -> None:
    """One <｜User｜> block for a run of user/tool messages, tool results in call order."""
    order = {}
    for position, call in enumerate(last_calls):
        order.setdefault(call.id, position)
    tool_slots = [k for k, m in enumerate(run) if isinstance(m, ToolMessage)]
    tools_sorted = sorted((run[k] for k in tool_slots), key=lambda m: order.get(m.tool_call_id, 0))
    arranged = list(run)
    for slot, message in zip(tool_slots, tools_sorted, strict=True):
        arranged[slot] = message

    out.special(Special.USER)
    for k, message in enumerate(arranged):
        if k:
            out.text("\n\n")
        if isinstance(message, ToolMessage):
            out.text("<tool_result>")
            out.parts(message.parts)
            out.text("</tool_result>")
        else:
            out.parts(message.parts)


def _assistant_turn(out: _Builder, message: AssistantMessage, keep_reasoning: bool) -> None:
    out.special(Special.ASSISTANT)
    if keep_reasoning:
        out.special(Special.THINK_START)
        out.text(message.reasoning_content or "")
    out.special(Special.THINK_END)
    out.text(message.content)
    if message.tool_calls:
        _tool_calls(out, message.tool_calls)
    out.special(Special.EOS)


def _prefix_turn(out: _Builder, thinking: bool, message: AssistantMessage) -> None:
    out.special(Special.ASSISTANT)
    if not thinking:
        out.special(Special.THINK_END)
        out.text(message.content)
        return
    out.special(Special.THINK_START)
    out.text(message.reasoning_content or "")
    if message.content:
        out.special(Special.THINK_END)
        out.text(message.content)


def _tool_calls(out: _Builder, calls: tuple[ToolCall, ...]) -> None:
    """The DSML block of a historical turn (ENCODING.md §2.7); names and values are text."""
    out.text("\n\n<")
    out.special(Special.DSML)
    out.text(" calls>\n")
    for n, call in enumerate(calls):
        if n:
            out.text("\n")
        out.text("<")
        out.special(Special.DSML)
        out.text(f' invoke name="{call.name}">\n')
        for k, (key, is_string, value) in enumerate(_parameters(call.arguments)):
            if k:
                out.text("\n")
            out.text("<")
            out.special(Special.DSML)
            out.text(f' parameter name="{key}" string="{"true" if is_string else "false"}">{value}</')
            out.special(Special.DSML)
            out.text(" parameter>")
        out.text("\n</")
        out.special(Special.DSML)
        out.text(" invoke>")
    out.text("\n</")
    out.special(Special.DSML)
    out.text(" calls>")


def _parameters(arguments: str) -> list[tuple[str, bool, str]]:
    try:
        value = json_text.loads(arguments)
    except json_text.JsonTextError:
        value = None
    if not isinstance(value, dict):
        return [("arguments", True, arguments)]
    return [
        (key, True, item) if isinstance(item, str) else (key, False, json_text.dumps(item))
        for key, item in value.items()
    ]
