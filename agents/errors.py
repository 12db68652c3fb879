"""Errors the agent runner raises; all are `Ds41Error`s so the CLI prints them without a traceback."""

from __future__ import annotations

from sglang_ds41.errors import Ds41Error


class AgentError(Ds41Error):
    """Base class for agent-runner errors."""


class AgentConfigError(AgentError):
    """An agent, tool or spec that cannot work as configured (found before any request is sent)."""


class ModelRequestError(AgentError):
    """The server refused a request, or transport errors outlasted the retry policy."""


class IncompleteStream(ModelRequestError):
    """A streamed response ended without a finish_reason (the connection dropped mid-answer)."""


class LimitExceeded(AgentError):
    """A run limit (steps, tool calls, wall clock, tokens, tool retries) stopped the run.

    `messages` holds the transcript up to the stop, so the caller can inspect or resume it.
    """

    def __init__(self, message: str, messages: list[dict] | None = None) -> None:
        super().__init__(message)
        self.messages = list(messages or [])


class OutputValidationError(AgentError):
    """The final answer never matched the requested output schema within the repair budget."""

    def __init__(self, message: str, content: str = "", messages: list[dict] | None = None) -> None:
        super().__init__(message)
        self.content = content
        self.messages = list(messages or [])


class RunLogError(AgentError):
    """An event log that cannot be resumed (missing, corrupt in the middle, or another agent's)."""
