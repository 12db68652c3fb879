"""`Agent`: the configuration of an agent (what to ask, with which tools, under which policies)."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from sglang_ds41.encoding import reasoning
from sglang_ds41.encoding.errors import EncodingError

from .errors import AgentConfigError
from .output import OutputSpec
from .policies import Policies
from .tools import Tool

DEFAULT_MODEL = "DeepSeek-V4.1-Flash"
# What DeepSeek-V4.1 understands (ENCODING.md §2.1/§2.3): low -> effort 50, high -> 75, max -> 100.
EFFORTS = ("low", "high", "max")


@dataclass(frozen=True)
class ReminderContext:
    """Facts a `latest_reminder` callback may use for the next step."""

    step: int
    tool_calls: int
    total_tokens: int
    elapsed_s: float
    messages: Sequence[dict[str, Any]]


@dataclass(frozen=True)
class Agent:
    """An agent's configuration. The runner holds no configuration of its own.

    * `thinking` / `reasoning_effort`: sent as `thinking: {"type": "enabled"|"disabled"}` and
      `chat_template_kwargs: {"thinking": bool}` in the request body (the first is what the
      DeepSeek renderer reads, the second what SGLang's template path reads), plus
      `reasoning_effort` (low/high/max) when thinking is on. `None` leaves the server default
      (high = effort 75).
    * `thinking_token_budget`: a hard cap on each model turn's reasoning tokens (`</think>`
      included), sent as the request field of that name; a server that knows it (ours,
      ENCODING.md §4.4) ends the reasoning there and the answer follows. `None` leaves the
      server's default.
    * `reminder`: called before every model request; a returned string is added as a
      `latest_reminder` message (per-step facts such as time left or the current date). Reminders
      stay in the transcript, so the prompt prefix (and the server's prefix cache) stays stable.
    * `output_type`: a pydantic model class or JSON Schema dict for a structured final answer;
      `max_output_repairs` bounds the repair turns when it does not validate.
    * `model_settings`: extra request fields (temperature, top_p, max_tokens, seed, extra_body ...);
      without `max_tokens` each request gets `model_turn.DEFAULT_MAX_TOKENS` (4096), `None` sends none.
    """

    name: str
    instructions: str | None = None
    model: str = DEFAULT_MODEL
    tools: Sequence[Tool] = ()
    output_type: Any = None
    thinking: bool = True
    reasoning_effort: str | None = None
    thinking_token_budget: int | None = None
    tool_choice: str | dict[str, Any] = "auto"
    reminder: Callable[[ReminderContext], str | None] | None = None
    model_settings: dict[str, Any] = field(default_factory=dict)
    policies: Policies = field(default_factory=Policies)
    max_output_repairs: int = 2

    def __post_init__(self) -> None:
        _check_types(self)
        names = [tool.name for tool in self.tools]
        duplicates = sorted({n for n in names if names.count(n) > 1})
        if duplicates:
            raise AgentConfigError(f"agent {self.name!r}: duplicate tool names {duplicates}")
        if self.reasoning_effort is not None and self.reasoning_effort not in EFFORTS:
            raise AgentConfigError(
                f"agent {self.name!r}: reasoning_effort must be one of {', '.join(EFFORTS)} or None, "
                f"got {self.reasoning_effort!r}"
            )
        try:
            reasoning.thinking_token_budget(self.thinking_token_budget)
        except EncodingError as error:
            raise AgentConfigError(f"agent {self.name!r}: {error}") from None
        if self.tool_choice not in ("auto", "none", "required") and not _named_choice(self.tool_choice):
            raise AgentConfigError(
                f"agent {self.name!r}: tool_choice must be auto, none, required or "
                f'{{"type": "function", "function": {{"name": ...}}}}, got {self.tool_choice!r}'
            )
        forcing = self.tool_choice == "required" or _named_choice(self.tool_choice)
        if forcing and self.thinking and self.tools:
            # The DeepSeek renderer refuses this combination (ENCODING.md §2.1); fail before sending.
            raise AgentConfigError(
                f"agent {self.name!r}: tool_choice {self.tool_choice!r} needs thinking=False "
                "(DeepSeek-V4.1 thinking mode supports only tool_choice auto or none)"
            )
        if _named_choice(self.tool_choice) and self.tool_choice["function"]["name"] not in names:
            raise AgentConfigError(f"agent {self.name!r}: tool_choice names an unknown tool")
        if self.max_output_repairs < 0:
            raise AgentConfigError(
                f"agent {self.name!r}: max_output_repairs must be >= 0, got {self.max_output_repairs}"
            )
        object.__setattr__(self, "_output", OutputSpec.of(self.output_type))

    @property
    def output(self) -> OutputSpec | None:
        return self._output  # type: ignore[attr-defined]

    def tool(self, name: str) -> Tool | None:
        return next((t for t in self.tools if t.name == name), None)

    def fingerprint(self) -> dict[str, Any]:
        """What must not change between a crash and a resume (the model's view of the agent)."""
        output = self.output.schema if self.output else None
        digest = hashlib.sha256(
            json.dumps([t.to_openai() for t in self.tools] + [output], sort_keys=True).encode()
        ).hexdigest()[:16]
        return {
            "agent": self.name,
            "model": self.model,
            "tools": sorted(t.name for t in self.tools),
            "schemas": digest,
        }


def _check_types(agent: Agent) -> None:
    """Wrong types at the public API are named here, not found later as a deep traceback."""
    if not isinstance(agent.name, str) or not agent.name:
        raise AgentConfigError(f"Agent name must be a non-empty str, got {agent.name!r}")
    where = f"agent {agent.name!r}"
    for field_name in ("instructions",):
        value = getattr(agent, field_name)
        if value is not None and not isinstance(value, str):
            raise AgentConfigError(f"{where}: {field_name} must be a str or None, got {type(value).__name__}")
    if not isinstance(agent.model, str):
        raise AgentConfigError(f"{where}: model must be a str, got {type(agent.model).__name__}")
    if isinstance(agent.tools, str | bytes | dict) or not isinstance(agent.tools, Sequence | tuple | list):
        raise AgentConfigError(f"{where}: tools must be a list of Tool, got {type(agent.tools).__name__}")
    for i, tool in enumerate(agent.tools):
        if not isinstance(tool, Tool):
            hint = " (decorate the function with @function_tool)" if callable(tool) else ""
            raise AgentConfigError(f"{where}: tools[{i}] must be a Tool, got {type(tool).__name__}{hint}")
    if not isinstance(agent.policies, Policies):
        raise AgentConfigError(f"{where}: policies must be a Policies, got {type(agent.policies).__name__}")
    if not isinstance(agent.model_settings, dict):
        raise AgentConfigError(
            f"{where}: model_settings must be a dict, got {type(agent.model_settings).__name__}"
        )
    if not isinstance(agent.thinking, bool):
        raise AgentConfigError(f"{where}: thinking must be a bool, got {type(agent.thinking).__name__}")
    if agent.reminder is not None and not callable(agent.reminder):
        raise AgentConfigError(
            f"{where}: reminder must be callable or None, got {type(agent.reminder).__name__}"
        )


def _named_choice(choice: Any) -> bool:
    return (
        isinstance(choice, dict)
        and choice.get("type") == "function"
        and isinstance(choice.get("function"), dict)
        and isinstance(choice["function"].get("name"), str)
    )
