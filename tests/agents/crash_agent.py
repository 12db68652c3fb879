"""A multi-step agent whose tools leave side effects in a file, for the crash-resume tests.

Importable as `tests.agents.crash_agent:make_agent` (the CLI test runs it in a subprocess); the
file comes from $CRASH_AGENT_FILE there.
"""

from __future__ import annotations

import os
from typing import Any

from sglang_ds41.agents import Agent, Limits, Policies, ToolContext, function_tool
from sglang_ds41.agents.testing import Reply

SCRIPT = [
    Reply(
        reasoning_content="two notes at once", tool_calls=[("note", {"text": "A"}), ("note", {"text": "B"})]
    ),
    Reply(reasoning_content="one more", tool_calls=[("note", {"text": "C"})]),
    Reply(reasoning_content="done", content="wrote A, B and C"),
]


def make_agent(path: str | None = None, *, idempotent: bool = True, approval: Any = None) -> Agent:
    """`approval`: if given, every note needs it (`needs_approval`) and this policy answers."""
    target = path or os.environ["CRASH_AGENT_FILE"]

    def note(text: str, ctx: ToolContext) -> str:
        """Append a line to the notes file.

        Args:
            text: The line.
        """
        # The call id is stable across crash and resume: the idempotency key of this side effect.
        with open(target, "a+", encoding="utf-8") as handle:
            handle.seek(0)
            if idempotent and any(line.startswith(ctx.call_id + " ") for line in handle):
                return f"noted {text}"  # same effect, same answer: safe to run again
            handle.write(f"{ctx.call_id} {text}\n")
        return f"noted {text}"

    return Agent(
        name="crash",
        instructions="Take notes.",
        tools=[function_tool(note, idempotent=idempotent, needs_approval=approval is not None)],
        reminder=lambda ctx: f"step {ctx.step}; {ctx.tool_calls} calls done",
        policies=Policies(limits=Limits(max_steps=10), **({"approval": approval} if approval else {})),
    )
