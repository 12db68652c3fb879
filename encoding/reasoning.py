"""A request's thinking mode and reasoning budgets: the rules and their error texts, in one
place for the client-side renderer (`request.py`) and the server (`plugin/serving/thinking.py`).

* DeepSeek's `thinking` field (`{"type": "enabled" | "adaptive" | "disabled"}`), typed as the
  official renderer types it (ENCODING.md §2.1);
* our `reasoning_budget` (integer 1-100): the number on the prompt's effort line (§2.3). It
  asks for a depth but cannot enforce one, and needs thinking on;
* `thinking_token_budget` (integer >= 1, vLLM's name): a hard cap the server enforces on the
  reasoning tokens (`</think>` included, as usage counts them) by forcing `</think>` (§4.4).
  It caps nothing with thinking off, so it is accepted there and has no effect.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .errors import EncodingError
from .serde_checks import describe, expect_enum, expect_object, optional_uint, required

THINKING_TYPES = {"enabled": True, "adaptive": True, "disabled": False}
REASONING_BUDGET = "reasoning_budget"
THINKING_TOKEN_BUDGET = "thinking_token_budget"
# The server's default thinking token budget (`sglang-ds41 serve --thinking-token-budget N`).
THINKING_TOKEN_BUDGET_ENV = "SGLANG_DS41_THINKING_TOKEN_BUDGET"


def thinking_from_field(value: Any) -> bool | None:
    """DeepSeek's `thinking` request field -> on/off; None when absent."""
    if value is None:
        return None
    value = expect_object(value, "thinking")
    kind = expect_enum(required(value, "type", "thinking"), "thinking.type", tuple(THINKING_TYPES))
    optional_uint(value.get("budget_tokens"), "thinking.budget_tokens", 64)
    return THINKING_TYPES[kind]


def reasoning_budget(value: Any) -> int | None:
    """`reasoning_budget`, validated; None when absent."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 100:
        raise EncodingError(f"{REASONING_BUDGET} must be an integer from 1 to 100, got {describe(value)}")
    return value


def check_budget_has_thinking(budget: int | None, thinking: bool, off_because: str) -> None:
    """`reasoning_budget` needs thinking mode; `off_because` says what turned it off."""
    if budget is not None and not thinking:
        raise EncodingError(f"{REASONING_BUDGET} needs thinking mode, but thinking is off ({off_because})")


def thinking_token_budget(value: Any, field: str = THINKING_TOKEN_BUDGET) -> int | None:
    """A `thinking_token_budget` (`field` says where it was given), validated; None when absent."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise EncodingError(f"{field} must be an integer of at least 1, got {describe(value)}")
    return value


def request_token_budget(body: Any) -> int | None:
    """The `thinking_token_budget` of a request body, given top-level or in
    `chat_template_kwargs` (the same value if both)."""
    if not isinstance(body, dict):
        return None
    top = thinking_token_budget(body.get(THINKING_TOKEN_BUDGET))
    kwargs = body.get("chat_template_kwargs")
    kwargs = kwargs if isinstance(kwargs, dict) else {}
    nested_field = f"chat_template_kwargs.{THINKING_TOKEN_BUDGET}"
    nested = thinking_token_budget(kwargs.get(THINKING_TOKEN_BUDGET), nested_field)
    if top is not None and nested is not None and top != nested:
        raise EncodingError(f"{THINKING_TOKEN_BUDGET} is {top} but {nested_field} is {nested}; give one")
    return top if top is not None else nested


def server_token_budget(environ: Mapping[str, str]) -> int | None:
    """The server's default `thinking_token_budget` (`THINKING_TOKEN_BUDGET_ENV`); None when unset."""
    raw = environ.get(THINKING_TOKEN_BUDGET_ENV, "").strip()
    if not raw:
        return None
    return thinking_token_budget(int(raw) if raw.isdecimal() else raw, THINKING_TOKEN_BUDGET_ENV)
