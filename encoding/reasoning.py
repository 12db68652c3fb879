"""A request's thinking mode and reasoning budgets: the rules and their error texts, in one
place for the client-side renderer (`request.py`) and the server (`plugin/thinking.py`).

* DeepSeek's `thinking` field (`{"type": "enabled" | "adaptive" | "disabled"}`), typed as the
  official renderer types it (ENCODING.md §2.1);
* our `reasoning_budget` (integer 1-100): the number on the prompt's effort line (§2.3). It
  asks for a depth but cannot enforce one, and needs thinking on.
"""

from __future__ import annotations

from typing import Any

from .errors import EncodingError
from .serde_checks import describe, expect_enum, expect_object, optional_uint, required

THINKING_TYPES = {"enabled": True, "adaptive": True, "disabled": False}
REASONING_BUDGET = "reasoning_budget"


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

