"""What a run returns."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class Usage:
    """Token counts summed over all model requests of a run, as the server reported them."""

    requests: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    reasoning_tokens: int = 0
    total_tokens: int = 0

    def add(self, usage: dict[str, Any] | None) -> None:
        self.requests += 1
        if not usage:
            return
        self.prompt_tokens += int(usage.get("prompt_tokens") or 0)
        self.completion_tokens += int(usage.get("completion_tokens") or 0)
        self.reasoning_tokens += int(usage.get("reasoning_tokens") or 0)
        self.total_tokens += int(usage.get("total_tokens") or 0)


@dataclass
class RunResult:
    """The outcome of a finished run.

    `final_output` is the text answer, or the validated value (pydantic instance or JSON data)
    when the agent has an output type. `messages` is the whole transcript in the form sent to
    the server (system, user, assistant with reasoning_content and tool_calls, tool results,
    latest_reminder), ready to continue the conversation. `approvals` are the approval policy's
    answers, in order: `{"call_id", "name", "arguments", "rule", "parameter", "reason", "granted"}`
    for each held-back call (`trust.Hold`; `parameter` is None when the whole call is held).
    """

    final_output: Any
    content: str
    messages: list[dict[str, Any]]
    usage: Usage
    steps: int
    tool_calls: int
    finish_reason: str
    run_dir: str | None = None
    warnings: list[str] = field(default_factory=list)
    approvals: list[dict[str, Any]] = field(default_factory=list)
