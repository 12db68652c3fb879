"""What the output parser returns: one assistant message, with its problems spelled out.

The official parser turns malformed model output into something that looks like a normal answer
(a call with `{}` arguments, a half-written argument string). Here every such case is kept
visible but carries a `problems` entry, and a call with problems has `valid=False`, so an agent
loop can refuse or retry instead of executing a wrong call.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

FinishReason = str  # "stop" | "length" | "tool_calls" | "content_filter"


@dataclass(frozen=True)
class ParsedToolCall:
    """One invoke. `arguments` is the JSON text exactly as the official parser builds it;
    `repairs` names what a tolerant parse read past (spellings that are not V4.1's, ENCODING.md
    §4.5) for a call that is nonetheless a call."""

    id: str
    name: str
    arguments: str
    problems: tuple[str, ...] = ()
    repairs: tuple[str, ...] = ()

    @property
    def valid(self) -> bool:
        return not self.problems

    @property
    def error(self) -> str:
        """The problems in one line (empty for a valid call)."""
        return "; ".join(self.problems)

    def to_openai(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "type": "function",
            "function": {"name": self.name, "arguments": self.arguments},
        }


@dataclass(frozen=True)
class ParsedMessage:
    """The assistant turn. `problems` holds message-level issues (text that was dropped, ...)."""

    reasoning_content: str = ""
    content: str = ""
    tool_calls: tuple[ParsedToolCall, ...] = ()
    finish_reason: FinishReason = "stop"
    problems: tuple[str, ...] = field(default=())
    # The name written so far of a call the output ended inside of (not in `tool_calls`, as the
    # official parser drops it; `problems` says so too).
    cut_call_name: str | None = None

    @property
    def valid(self) -> bool:
        """No message-level problem and every call valid."""
        return not self.problems and all(call.valid for call in self.tool_calls)

    def to_openai(self) -> dict[str, Any]:
        """An OpenAI Chat Completions assistant message (the official response's field set)."""
        message: dict[str, Any] = {
            "role": "assistant",
            "content": self.content,
            "reasoning_content": self.reasoning_content,
        }
        if self.tool_calls:
            message["tool_calls"] = [call.to_openai() for call in self.tool_calls]
        return message

    def diagnostics(self) -> dict[str, Any]:
        """The validity flags, for logs and the `parse` command."""
        return {
            "valid": self.valid,
            "problems": list(self.problems),
            "tool_calls": [
                {"index": i, "id": call.id, "valid": call.valid, "problems": list(call.problems)}
                | ({"repairs": list(call.repairs)} if call.repairs else {})
                for i, call in enumerate(self.tool_calls)
            ],
        }
