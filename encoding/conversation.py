"""The conversation stage: a validated, normalised request, ready to render.

`request.py` builds these from an OpenAI Chat Completions body; `render.py` turns them into a
prompt. Everything is frozen so a conversation can be shared and cached without copying.
JSON values (tool schemas, response schemas) are held as parsed Python values whose numbers
already follow serde semantics (see `json_text.py`), so rendering never re-reads JSON text.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

ImageDetail = Literal["low", "high", "original", "auto"]
ToolChoice = Literal["auto", "none", "required"]
ResponseFormat = Literal["text", "json_object", "json_schema", "regex"]


@dataclass(frozen=True)
class ImageSource:
    """Where an image comes from; rendering only needs its position, the backend fetches it."""

    kind: Literal["data_url", "url"]
    url: str
    detail: ImageDetail = "high"
    path: str = ""


@dataclass(frozen=True)
class ImagePart:
    """One image placeholder inside a message's content."""

    source: ImageSource


# A content part is plain text or an image placeholder; parts are joined with "\n\n".
Part = str | ImagePart


@dataclass(frozen=True)
class ToolCall:
    """A historical call; `arguments` is the client's string, rendered per ENCODING.md §2.7."""

    id: str
    name: str
    arguments: str


@dataclass(frozen=True)
class SystemMessage:
    parts: tuple[Part, ...]
    role: Literal["system"] = "system"


@dataclass(frozen=True)
class UserMessage:
    parts: tuple[Part, ...]
    role: Literal["user"] = "user"


@dataclass(frozen=True)
class ToolMessage:
    parts: tuple[Part, ...]
    tool_call_id: str
    role: Literal["tool"] = "tool"


@dataclass(frozen=True)
class LatestReminderMessage:
    content: str
    role: Literal["latest_reminder"] = "latest_reminder"


@dataclass(frozen=True)
class AssistantMessage:
    content: str
    reasoning_content: str | None = None
    tool_calls: tuple[ToolCall, ...] = ()
    prefix: bool = False
    role: Literal["assistant"] = "assistant"


Message = SystemMessage | UserMessage | ToolMessage | LatestReminderMessage | AssistantMessage


@dataclass(frozen=True)
class ToolDefinition:
    """A declared function; `parameters` is a parsed JSON value (None when absent)."""

    name: str
    description: str | None = None
    parameters: Any = None


@dataclass(frozen=True)
class Conversation:
    """Everything the renderer needs.

    `reasoning_budget` is the N of the effort line (1-100) when thinking is on, else None;
    the named efforts map to 50/75/100 in `request.py`. `tools` is already reduced by
    `tool_choice` (none -> empty, named -> that tool, choice becomes "required").
    """

    messages: tuple[Message, ...]
    thinking: bool = True
    reasoning_budget: int | None = 75
    tools: tuple[ToolDefinition, ...] = ()
    tool_choice: ToolChoice = "auto"
    response_format: ResponseFormat = "text"
    response_schema: Any = None
    response_regex: str | None = None


@dataclass(frozen=True)
class ParsingOptions:
    """Where the output parser starts, as decided by the request (ENCODING.md §2.11, §4.2).

    thinking: the prompt asked for reasoning (output starts in reasoning unless a prefix says
        otherwise).
    reasoning_started: a prefix continuation ends inside reasoning text (keep leading newlines).
    in_content: a prefix continuation ends inside the answer (reasoning is over; keep leading
        newlines).
    parse_tool_calls: tools are declared, so DSML blocks are calls rather than content.
    starts_in_tool_calls: the prompt already opened a calls block (required/named tool choice).
    parse_json_output: json_object response format; text around the JSON value is blanked.
    tolerant: also read the call spellings models write besides V4.1's (ENCODING.md §4.5), and
        say so per call (`ParsedToolCall.repairs`); output in V4.1's own spelling parses the same.
    """

    thinking: bool = True
    reasoning_started: bool = False
    in_content: bool = False
    parse_tool_calls: bool = False
    starts_in_tool_calls: bool = False
    parse_json_output: bool = False
    tolerant: bool = False
