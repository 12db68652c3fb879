"""The untrusted-content policy: once text the user did not write is in the context, the model
may no longer act on the world on its own.

Why: a tool's output (an email, a web page, a file, a review) can carry instructions, and a model
may follow them. What the runner knows is where each piece of text came from, so the rule is
stated in those terms.

Tools declare their `effect` and whether their output is trusted (`Tool.effect`,
`Tool.trusted_output`):

* `read`: reads, changes nothing and sends nothing out. Always runs.
* `write`: changes state (files, calendars, passwords, accounts). Undeclared tools count as this.
* `network`, `messages`, `payments`: egress; data or money leaves (a URL is fetched, a message or
  payment is sent). Fetching a URL counts, because the URL itself can carry data out.

Output is untrusted when the tool says so (`trusted_output=False`); a `network` tool's output is
untrusted unless it says otherwise.

The rule, checked for every `write` or egress call while any untrusted output is in the
transcript (until then nothing is checked):

1. *Argument provenance*: the call runs when no argument was introduced by untrusted content.
   A string argument (and every URL, e-mail address and long digit-bearing token inside one, such
   as an IBAN or a file id) is introduced by untrusted content when it occurs in an untrusted tool
   output but in no trusted text: the system and user messages and trusted tool outputs
   (comparison ignores case and runs of white space; values under `min_chars` characters, numbers
   and booleans are not evidence). So a value the user typed, or one a trusted tool returned, may
   flow anywhere; one that only a web page or an email supplied may not flow into an action.
2. Otherwise the call needs the approval policy's grant for that exact call (`DenyAll`, the
   default, grants nothing: fail closed). A denied call is answered with a message that names the
   value and the tool whose output introduced it, and the run goes on.

On by default for an agent whose tools declare an effect; `Policies(untrusted=UntrustedContent())`
turns it on for any agent, `Policies(untrusted=None)` turns it off.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:
    from .tools import Tool

Effect = Literal["read", "write", "network", "messages", "payments"]
EFFECTS: tuple[str, ...] = ("read", "write", "network", "messages", "payments")
EGRESS = frozenset({"network", "messages", "payments"})

# Tokens inside a longer string that name a destination or an object by themselves.
_TOKENS = re.compile(
    r"(?:https?://|www\.)\S+|[\w.+-]+@[\w-]+(?:\.[\w-]+)+|\b(?=[A-Za-z0-9-]*\d)[A-Za-z0-9-]{10,}\b"
)
_SPACE = re.compile(r"\s+")


def output_trusted(tool: Tool) -> bool:
    if tool.trusted_output is not None:
        return tool.trusted_output
    return tool.effect != "network"


def guarded(tool: Tool) -> bool:
    """Whether calls of this tool are checked once untrusted content is in the context."""
    return tool.effect != "read"


@dataclass(frozen=True)
class Sources:
    """The transcript's text split by where it came from (normalised for comparison)."""

    trusted: str
    untrusted: tuple[tuple[str, str], ...]  # (tool name, normalised output)

    @classmethod
    def of(cls, messages: Sequence[dict[str, Any]], tools: dict[str, Tool]) -> Sources:
        names = {
            call["id"]: call["function"]["name"]
            for message in messages
            if message.get("role") == "assistant"
            for call in message.get("tool_calls") or []
        }
        trusted: list[str] = []
        untrusted: list[tuple[str, str]] = []
        for message in messages:
            role, text = message.get("role"), _text(message.get("content"))
            if role in ("system", "developer", "user"):
                trusted.append(text)
            elif role == "tool":
                name = names.get(message.get("tool_call_id", ""), "")
                tool = tools.get(name)
                if tool is not None and not output_trusted(tool):
                    untrusted.append((name, normalise(text)))
                else:
                    trusted.append(text)
        return cls(normalise("\n".join(trusted)), tuple(untrusted))


@dataclass(frozen=True)
class UntrustedContent:
    """The policy's settings; see the module docstring for the rule."""

    provenance: bool = True  # False: every guarded call needs approval once content is untrusted
    min_chars: int = 4

    def review(self, tool: Tool, arguments: dict[str, Any], sources: Sources) -> str | None:
        """None when the call may run; else why it needs approval (the text the model is told)."""
        if not guarded(tool) or not sources.untrusted:
            return None
        kind = "egress" if tool.effect in EGRESS else "side-effecting"
        if not self.provenance:
            return f"{tool.name} is {kind} and the context holds untrusted tool output"
        for value in self._evidence(arguments):
            needle = normalise(value)
            if needle in sources.trusted:
                continue
            origin = next((name for name, text in sources.untrusted if needle in text), None)
            if origin is not None:
                return (
                    f"{tool.name} is {kind} and its argument value {value!r} comes from the output of "
                    f"{origin}, which is untrusted, not from the user"
                )
        return None

    def _evidence(self, arguments: Any) -> Iterator[str]:
        for leaf in _strings(arguments):
            text = leaf.strip()
            if len(text) >= self.min_chars:
                yield text
            for token in _TOKENS.findall(text):
                if token != text and len(token) >= self.min_chars:
                    yield token


def normalise(text: str) -> str:
    return _SPACE.sub(" ", text).casefold()


def _strings(value: Any) -> Iterator[str]:
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for item in value.values():
            yield from _strings(item)
    elif isinstance(value, list | tuple):
        for item in value:
            yield from _strings(item)


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # content parts
        return "\n".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
    return "" if content is None else str(content)
