"""Conversation -> RenderedPrompt, byte-exact with the official V4.1 renderer (ENCODING.md §2).

The prompt is built as a list of pieces, each plain text or one special token, so that the
special spans (which become single ids) are known exactly; text typed by users that happens
to spell a special token stays plain text and is never given a special id.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
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
_SPELLING = {s: s.value for s in Special}
_ID = {s: s.id for s in Special}
_JSON_FORMATS = ("json_object", "json_schema")


@dataclass(frozen=True)
class RenderedPrompt:
    """The prompt string, its special-token spans (code-point offsets) and image sources."""

    text: str
    special_spans: tuple[SpecialSpan, ...]
    image_sources: tuple[ImageSource, ...]


class PromptBuilder:
    """The prompt as pieces, each plain text or one special token (`tokens[i]` is None for text)."""

    def __init__(self) -> None:
        self.pieces: list[str] = []
        self.tokens: list[Special | None] = []
        self.images: list[ImageSource] = []

    def text(self, text: str) -> None:
        self.pieces.append(text)
        self.tokens.append(None)

    def special(self, token: Special) -> None:
        self.pieces.append(_SPELLING[token])
        self.tokens.append(token)

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
        spans = []
        offset = 0
        for piece, token in zip(self.pieces, self.tokens, strict=True):
            if token is not None:
                spans.append(SpecialSpan(offset, offset + len(piece), token))
            offset += len(piece)
        return RenderedPrompt("".join(self.pieces), tuple(spans), tuple(self.images))

    def starts_with_special(self) -> bool:
        """Whether no text comes before the first special token (then the ids of what this
        builder holds do not depend on what was rendered before it, ENCODING.md §1.3)."""
        for piece, token in zip(self.pieces, self.tokens, strict=True):
            if token is not None:
                return True
            if piece:
                return False
        return True

    def ids(self, encode: Callable[[str], Sequence[int]]) -> list[int]:
        """Token ids of the pieces: each special token its id, each text run `encode`d."""
        ids: list[int] = []
        run: list[str] = []
        for piece, token in zip(self.pieces, self.tokens, strict=True):
            if token is None:
                run.append(piece)
                continue
            if run:
                ids += encode("".join(run))
                run = []
            ids.append(_ID[token])
        if run:
            ids += encode("".join(run))
        return ids


def render_conversation(conv: Conversation) -> RenderedPrompt:
    out = PromptBuilder()
    writer = PromptWriter(conv)
    for message in conv.messages:
        writer.add(out, message)
    writer.finish(out)
    return out.build()


@dataclass
class PromptWriter:
    """Renders `conv`'s settings with messages given one at a time (ENCODING.md §2, §10.2).

    `add` writes only text that no later message can change, each write starting with a
    special token; a run of user/tool messages waits until a message of another kind (or
    `finish`) closes it, since later results join its block and are put in call order, and a
    continued (prefix) turn waits for `finish`. `finish` writes the rest and the generation
    header. A copy (`copy.copy`) resumes where this one stands.
    """

    conv: Conversation
    started: bool = False
    count: int = 0
    last_calls: tuple[ToolCall, ...] = ()
    after_reminder: bool = False
    run: tuple[Message, ...] = ()
    prefix: AssistantMessage | None = None

    def add(self, out: PromptBuilder, message: Message) -> None:
        self.count += 1
        if self.prefix is not None:
            return  # nothing after a continued turn is rendered
        if not self.started:
            self.started = True
            out.special(Special.BOS)
            conv = self.conv
            if isinstance(message, SystemMessage):
                _first_block(out, conv, message)
                return
            if conv.thinking or conv.tools or conv.response_format in _JSON_FORMATS:
                _first_block(out, conv, None)
        if isinstance(message, (UserMessage, ToolMessage)):
            self.run += (message,)
            self.after_reminder = False
            return
        self._close_run(out)
        if isinstance(message, SystemMessage):
            out.special(Special.SYSTEM)
            out.parts(message.parts)
        elif isinstance(message, LatestReminderMessage):
            if not self.after_reminder:
                out.special(Special.LATEST_REMINDER)
                out.text(message.content)
        elif message.prefix:
            self.prefix = message
        else:
            _assistant_turn(out, message, self.conv.thinking and bool(self.conv.tools))
            if message.tool_calls:
                self.last_calls = message.tool_calls
        self.after_reminder = isinstance(message, LatestReminderMessage)

    def finish(self, out: PromptBuilder) -> None:
        conv = self.conv
        if not self.started:
            out.special(Special.BOS)
            if conv.tools or conv.response_format in _JSON_FORMATS:
                _first_block(out, conv, None)
        self._close_run(out)
        if self.prefix is not None:
            _prefix_turn(out, conv.thinking and not _prefix_closes(self.count, conv), self.prefix)
            return
        out.special(Special.ASSISTANT)
        out.special(Special.THINK_START if conv.thinking else Special.THINK_END)
        if conv.tool_choice == "required" and conv.tools:
            out.text("\n\n<")
            out.special(Special.DSML)
            out.text(" calls>\n")

    def _close_run(self, out: PromptBuilder) -> None:
        if self.run:
            _user_block(out, list(self.run), self.last_calls)
            self.run = ()


def prefix_closes_reasoning(conv: Conversation) -> bool:
    """Whether a continued (prefix) turn is rendered `</think>` + content despite thinking.

    The official renderer does this when the continued turn is the only message and the first
    block holds nothing but the effort line (no system text, tools or JSON format).
    """
    return _prefix_closes(len(conv.messages), conv)


def _prefix_closes(message_count: int, conv: Conversation) -> bool:
    return message_count == 1 and not conv.tools and conv.response_format not in _JSON_FORMATS


def _first_block(out: PromptBuilder, conv: Conversation, system: Message | None) -> None:
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
    if conv.response_format in _JSON_FORMATS:
        schema = {"type": "json_object"} if conv.response_format == "json_object" else conv.response_schema
        out.text("\n\n" + RESPONSE_FORMAT_SECTION.format(schema=json_text.dumps(schema)))


def _tool_line(tool: Any) -> dict[str, Any]:
    return {
        "name": tool.name,
        "description": tool.description or "",
        "parameters": {} if tool.parameters is None else tool.parameters,
    }


def _user_block(out: PromptBuilder, run: list[Message], last_calls: tuple[ToolCall, ...]) -> None:
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


def _assistant_turn(out: PromptBuilder, message: AssistantMessage, keep_reasoning: bool) -> None:
    out.special(Special.ASSISTANT)
    if keep_reasoning:
        out.special(Special.THINK_START)
        out.text(message.reasoning_content or "")
    out.special(Special.THINK_END)
    _answer(out, message)


def _answer(out: PromptBuilder, message: AssistantMessage) -> None:
    """An assistant turn after its `</think>`: the content, the DSML calls, EOS."""
    out.text(message.content)
    if message.tool_calls:
        _tool_calls(out, message.tool_calls)
    out.special(Special.EOS)


def render_completion(message: AssistantMessage, thinking: bool) -> RenderedPrompt:
    """What the model writes for `message` after the generation header of §2.5 (`<think>` in
    thinking mode, `</think>` otherwise): the reasoning and `</think>` when thinking, then the
    content, the DSML calls and EOS. A finished turn in a thinking conversation with tools is
    rendered as the header followed by exactly this (§2.4), so a history reads as generated."""
    out = PromptBuilder()
    if thinking:
        out.text(message.reasoning_content or "")
        out.special(Special.THINK_END)
    _answer(out, message)
    return out.build()


def _prefix_turn(out: PromptBuilder, thinking: bool, message: AssistantMessage) -> None:
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


def _tool_calls(out: PromptBuilder, calls: tuple[ToolCall, ...]) -> None:
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
