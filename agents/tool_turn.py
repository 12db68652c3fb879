"""The tool turn of an agent run: the calls of the model's last answer, answered in call order.

A call is answered once: by its tool's result, or by why it did not run -- an unknown tool,
invalid arguments, a call held back by the policies and not approved (needs approval, or the
untrusted-content policy of trust.py), a call cut off by the token limit, one interrupted by a
stopped process (re-run only if its tool is idempotent). Calls the server flagged as malformed
get one repair turn naming each problem. Failures count against each tool's retry budget, and
the run's limits (tool calls, tool timeouts, result size) apply.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

from .errors import LimitExceeded
from .events import PendingCall
from .policies import ask
from .tools import PreparedCall, Tool, ToolContext
from .trust import Hold, Sources

if TYPE_CHECKING:
    from .runner import _Loop

INTERRUPTED = (
    "Error: this call was interrupted: the agent process stopped while it was running, so it may "
    "or may not have taken effect. Check before repeating it."
)
MALFORMED = (
    "Error: not executed: these tool calls were malformed, so none of them ran. Write each one again, "
    "complete and with valid arguments, if it is still needed:\n"
)
TRUNCATED = (
    "Error: not executed: the response was cut off at the token limit (finish_reason=length), so "
    "this call may be incomplete. Make the call again if it is still needed."
)


class ToolTurn:
    """The tools' side of a run's loop: `answer_calls`, and `repair_calls` for malformed ones."""

    def __init__(self, loop: _Loop) -> None:
        self.loop = loop
        self._sources: tuple[int, Sources] | None = None  # (transcript length, its Sources)

    def repair_calls(self) -> None:
        """A repair turn for the calls the server flagged as malformed: none of them ran."""
        calls = self.loop.state.invalid_calls
        lines = [f"- {c['name'] or '(a call without a name)'}: {c['error']}" for c in calls]
        self.loop.record(
            "message",
            message={"role": "user", "content": MALFORMED + "\n".join(lines)},
            reason="tool_call_repair",
            names=[c["name"] for c in calls],
        )
        self.check_retry_budgets()

    async def answer_calls(self) -> None:
        agent, st = self.loop.agent, self.loop.state
        open_calls = [c for c in st.pending if c.result is None]
        if st.last_finish_reason == "length":
            for call in open_calls:  # a call cut by the token limit is never executed
                self.finish_call(call, "truncated", TRUNCATED)
            return
        for call in open_calls:
            if call.started and not (agent.tool(call.name) and agent.tool(call.name).idempotent):
                self.finish_call(call, "interrupted", INTERRUPTED)
        open_calls = [c for c in open_calls if c.result is None]
        limit = self.loop.limits.max_tool_calls
        if limit is not None and st.tool_calls + len(open_calls) > limit:
            raise LimitExceeded(
                f"max_tool_calls reached: the model asked for {len(open_calls)} more calls after "
                f"{st.tool_calls} (limit {limit})"
            )
        if not self.loop.limits.parallel_tool_calls:
            for call in open_calls:
                prepared = self.prepare(call)
                if prepared is not None:
                    self.mark_started(call)
                    self.loop.sync()
                    await self.execute(prepared)
        else:
            # Every call is prepared (and any approval asked) before the first is marked started:
            # a run stopped while an approver thinks has started nothing.
            ready = [(call, prepared) for call in open_calls if (prepared := self.prepare(call)) is not None]
            for call, _ in ready:
                self.mark_started(call)
            if ready:
                self.loop.sync()
                await asyncio.gather(*(self.execute(prepared) for _, prepared in ready))
        self.check_retry_budgets()

    def mark_started(self, call: PendingCall) -> None:
        if not call.started:
            self.loop.record("tool_started", call_id=call.id, name=call.name, arguments=call.arguments)

    def prepare(self, call: PendingCall) -> PreparedCall | None:
        tool = self.loop.agent.tool(call.name)
        if tool is None:
            names = ", ".join(t.name for t in self.loop.agent.tools) or "none"
            self.finish_call(
                call,
                "unknown_tool",
                f"Error: there is no tool named {call.name!r}. Available tools: {names}.",
            )
            return None
        prepared = tool.prepare(call.id, call.arguments)
        if isinstance(prepared, str):
            self.finish_call(call, "invalid_arguments", prepared)
            return None
        why = self.hold(tool, prepared.arguments)
        if why is not None and not self.approved(call, prepared.arguments, why):
            if why.rule == "needs approval":
                text = f"Denied: {tool.name} needs approval for this exact call, and it was not granted."
            else:
                text = f"Denied: {why}; such a call needs the user's approval, and it was not granted."
            self.finish_call(call, "denied", text)
            return None
        return prepared

    def hold(self, tool: Tool, arguments: dict[str, Any]) -> Hold | None:
        """Why this call needs the approval policy's grant, if it does."""
        if tool.needs_approval:
            return Hold("needs approval", f"{tool.name} needs approval for every call")
        guard = self.loop.agent.policies.untrusted_policy(self.loop.agent.tools)
        return guard.review(tool, arguments, self.sources()) if guard is not None else None

    def approved(self, call: PendingCall, arguments: dict[str, Any], why: Hold) -> bool:
        """The approval policy's answer, asked once per call and logged (a resumed run reuses it)."""
        if call.approval is not None:
            return call.approval
        granted = ask(self.loop.agent.policies.approval, call.name, arguments, why)
        self.loop.record(
            "approval",
            call_id=call.id,
            name=call.name,
            arguments=call.arguments,
            rule=why.rule,
            parameter=why.parameter,
            reason=why.message,
            granted=granted,
        )
        return granted

    def sources(self) -> Sources:
        """The transcript split by provenance, rebuilt only when it grew (it is append-only):
        the calls of one turn are reviewed against the same transcript."""
        length = len(self.loop.state.messages)
        if self._sources is None or self._sources[0] != length:
            tools = {t.name: t for t in self.loop.agent.tools}
            state = self.loop.state
            self._sources = (length, Sources.of(state.messages, tools, state.runner_turns, state.unreached))
        return self._sources[1]

    async def execute(self, prepared: PreparedCall) -> None:
        tool = prepared.tool
        timeout = tool.timeout_s if tool.timeout_s is not None else self.loop.limits.tool_timeout_s
        left = self.loop.remaining_s()
        if left is not None:
            timeout = max(min(timeout, left), 0.001)
        executor = self.loop.agent.policies.executor_for(tool.isolation)
        ctx = ToolContext(prepared.call_id, tool.name, self.loop.run_dir)
        outcome = await executor.execute(prepared, ctx, timeout)
        call = next(c for c in self.loop.state.pending if c.id == prepared.call_id)
        self.finish_call(call, outcome.status, outcome.text)

    def finish_call(self, call: PendingCall, status: str, text: str) -> None:
        cap = self.loop.limits.max_tool_result_chars
        if len(text) > cap:
            text = text[:cap] + f"\n[truncated: {len(text) - cap} more characters]"
        self.loop.record("tool_finished", call_id=call.id, name=call.name, status=status, result=text)

    def check_retry_budgets(self) -> None:
        for name, failures in self.loop.state.failures.items():
            tool = self.loop.agent.tool(name)
            if tool is not None and failures > tool.max_retries:
                raise LimitExceeded(
                    f"tool {name!r} failed {failures} times (retry budget {tool.max_retries}); "
                    f"last result: {self.last_result(name)}"
                )

    def last_result(self, name: str) -> str:
        ids = {
            c["id"]
            for m in self.loop.state.messages
            for c in m.get("tool_calls") or []
            if c["function"]["name"] == name
        }
        for message in reversed(self.loop.state.messages):
            if message.get("role") == "tool" and message.get("tool_call_id") in ids:
                return str(message.get("content"))[:200]
        return ""
