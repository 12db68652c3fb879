"""`Runner`: the agent loop (sync, async, streamed) and `resume` from an event log.

One step: (optional `latest_reminder`) -> model request (retried on transport errors) ->
response logged -> its tool calls answered in call order -> next step; a response without calls
is the final answer (validated against the output type, with bounded repair turns). Calls the
server flags as malformed (`invalid_tool_calls`: broken arguments, cut off by `max_tokens`) are
never executed: the runner answers them with a repair turn naming each problem, and they count
against their tool's retry budget.

The loop is driven by the state rebuilt from events (events.py), which makes resume the same
code path as a fresh run: whatever the log says is done is not done again.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

import openai

from .agent import Agent, ReminderContext
from .errors import (
    AgentConfigError,
    IncompleteStream,
    LimitExceeded,
    ModelRequestError,
    OutputValidationError,
    RunLogError,
)
from .events import Event, PendingCall, RunState
from .log import EventLog, read_log
from .output import calls_repair_prompt, repair_prompt, to_jsonable, unparsed_calls
from .policies import ask
from .result import RunResult
from .tools import PreparedCall, Tool, ToolContext
from .transport import post_completion, post_streamed
from .trust import Hold, Sources

Input = str | list[dict[str, Any]]
INTERRUPTED = (
    "Error: this call was interrupted: the agent process stopped while it was running, so it may "
    "or may not have taken effect. Check before repeating it."
)
# `max_tokens` of every request unless `model_settings` sets it (None: send none, the server's
# default): without one SGLang generates up to the context length, minutes on a slow server.
DEFAULT_MAX_TOKENS = 4096


def request_token_limit(model_settings: dict[str, Any]) -> int | None:
    """The completion-token limit each request asks for under these settings (before a run's
    `max_total_tokens` caps it): `max_completion_tokens`, else `max_tokens`, else the default;
    None sends none (the server's default)."""
    if model_settings.get("max_completion_tokens") is not None:
        return model_settings["max_completion_tokens"]
    return model_settings.get("max_tokens", DEFAULT_MAX_TOKENS)


# The server's extension field for calls it could not parse (sglang_ds41/plugin/parsers.py).
INVALID_TOOL_CALLS = "invalid_tool_calls"
MALFORMED = (
    "Error: not executed: these tool calls were malformed, so none of them ran. Write each one again, "
    "complete and with valid arguments, if it is still needed:\n"
)
TRUNCATED = (
    "Error: not executed: the response was cut off at the token limit (finish_reason=length), so "
    "this call may be incomplete. Make the call again if it is still needed."
)


def _client(client: Any, base_url: str | None, api_key: str | None) -> tuple[openai.AsyncOpenAI, bool]:
    """(client, owned). Our RetryPolicy does the retrying, so the client's own retries are off."""
    if client is not None:
        return client.with_options(max_retries=0), False
    if base_url is None:
        raise ModelRequestError("no server: pass base_url=... (e.g. http://127.0.0.1:30000/v1) or client=...")
    key = api_key or os.environ.get("OPENAI_API_KEY") or "EMPTY"
    return openai.AsyncOpenAI(base_url=base_url, api_key=key, max_retries=0), True


def _check_call(method: str, agent: Any, input: Any = None, *, has_input: bool = True) -> None:
    """Clear errors for wrong argument types, before any request is sent."""
    if not isinstance(agent, Agent):
        raise AgentConfigError(f"Runner.{method}: agent must be an Agent, got {type(agent).__name__}")
    if not has_input:
        return
    if isinstance(input, str):
        return
    if not isinstance(input, list):
        raise AgentConfigError(
            f"Runner.{method}: input must be a str or a list of message dicts, got {type(input).__name__}"
        )
    for i, message in enumerate(input):
        if not isinstance(message, dict) or not isinstance(message.get("role"), str):
            raise AgentConfigError(
                f"Runner.{method}: input[{i}] must be a message dict with a 'role', got {message!r:.80}"
            )


class Runner:
    """Runs agents. All methods are static: the runner holds no configuration."""

    @staticmethod
    async def run(
        agent: Agent,
        input: Input,
        *,
        client: Any = None,
        base_url: str | None = None,
        api_key: str | None = None,
        run_dir: str | os.PathLike[str] | None = None,
        on_event: Callable[[Event], None] | None = None,
    ) -> RunResult:
        """Run to a final answer. With `run_dir`, every event is logged there (resumable);
        `on_event` sees each event as it happens (progress: `step_started`, `model_response`,
        `tool_started`, `tool_finished`, ...), without streaming the requests."""
        _check_call("run", agent, input)
        async with _Session(agent, client, base_url, api_key, run_dir, resume=False, observe=on_event) as run:
            return await run.start(input)

    @staticmethod
    def run_sync(agent: Agent, input: Input, **kwargs: Any) -> RunResult:
        _check_call("run_sync", agent, input)
        return asyncio.run(Runner.run(agent, input, **kwargs))

    @staticmethod
    def run_streamed(agent: Agent, input: Input, **kwargs: Any) -> RunStream:
        """Iterate `async for event in Runner.run_streamed(...)`; then read `.result`."""
        _check_call("run_streamed", agent, input)

        async def drive(publish: Callable[[Event], None]) -> RunResult:
            async with _Session(
                agent,
                kwargs.get("client"),
                kwargs.get("base_url"),
                kwargs.get("api_key"),
                kwargs.get("run_dir"),
                resume=False,
                publish=publish,
            ) as run:
                return await run.start(input)

        return RunStream(drive)

    @staticmethod
    async def resume(
        agent: Agent,
        run_dir: str | os.PathLike[str],
        *,
        client: Any = None,
        base_url: str | None = None,
        api_key: str | None = None,
        on_event: Callable[[Event], None] | None = None,
    ) -> RunResult:
        """Continue a run from its log: completed tools are not run again, nothing is lost.

        A tool call that was started but has no result gets an explicit "interrupted" result
        (or runs again if its tool is marked `idempotent`).
        """
        _check_call("resume", agent, has_input=False)
        async with _Session(agent, client, base_url, api_key, run_dir, resume=True, observe=on_event) as run:
            return await run.resume()

    @staticmethod
    def resume_sync(agent: Agent, run_dir: str | os.PathLike[str], **kwargs: Any) -> RunResult:
        return asyncio.run(Runner.resume(agent, run_dir, **kwargs))


class RunStream:
    """The events of a streamed run, persisted ones and deltas, as they happen."""

    _END = object()

    def __init__(self, drive: Callable[[Callable[[Event], None]], Any]) -> None:
        self._drive = drive
        self.result: RunResult | None = None

    async def __aiter__(self) -> AsyncIterator[Event]:
        queue: asyncio.Queue[Any] = asyncio.Queue()
        task = asyncio.create_task(self._drive(queue.put_nowait))
        task.add_done_callback(lambda _: queue.put_nowait(self._END))
        while (item := await queue.get()) is not self._END:
            yield item
        self.result = task.result()  # re-raises the run's error, if any


class _Session:
    """Owns the client and the log for one run or resume."""

    def __init__(
        self,
        agent: Agent,
        client: Any,
        base_url: str | None,
        api_key: str | None,
        run_dir: Any,
        *,
        resume: bool,
        publish: Callable[[Event], None] | None = None,
        observe: Callable[[Event], None] | None = None,
    ) -> None:
        self.agent, self.run_dir, self.resume, self.publish = agent, run_dir, resume, publish
        self.observe = observe
        self.client_args = (client, base_url, api_key)

    async def __aenter__(self) -> _Loop:
        events = read_log(self.run_dir) if self.resume else []
        self.client, self.owned = _client(*self.client_args)
        self.log = EventLog(self.run_dir, resume=self.resume) if self.run_dir is not None else None
        return _Loop(
            self.agent,
            self.client,
            self.log,
            self.publish,
            events,
            str(self.run_dir) if self.run_dir is not None else None,
            self.observe,
        )

    async def __aexit__(self, *exc: Any) -> None:
        if self.log is not None:
            self.log.close()
        if self.owned:
            await self.client.close()


@dataclass(frozen=True)
class _Reply:
    message: dict[str, Any]
    finish_reason: str
    usage: dict[str, Any] | None
    warnings: list[str]
    invalid_calls: list[dict[str, Any]]


class _Loop:
    def __init__(
        self,
        agent: Agent,
        client: openai.AsyncOpenAI,
        log: EventLog | None,
        publish: Callable[[Event], None] | None,
        events: list[Event],
        run_dir: str | None,
        observe: Callable[[Event], None] | None = None,
    ) -> None:
        self.agent, self.client, self.log, self.publish, self.run_dir = agent, client, log, publish, run_dir
        self.observe = observe
        self.state = RunState.replay(events) if events else RunState()
        self.started = time.monotonic()
        self.limits = agent.policies.limits
        self.final_value: Any = None
        self._sources: tuple[int, Sources] | None = None  # (transcript length, its Sources)

    # ---- entry points ---------------------------------------------------------------------

    async def start(self, input: Input) -> RunResult:
        messages: list[dict[str, Any]] = []
        if self.agent.instructions:
            messages.append({"role": "system", "content": self.agent.instructions})
        messages += (
            [{"role": "user", "content": input}] if isinstance(input, str) else [dict(m) for m in input]
        )
        self.record("run_started", messages=messages, fingerprint=self.agent.fingerprint())
        return await self.drive()

    async def resume(self) -> RunResult:
        expected, found = self.agent.fingerprint(), self.state.fingerprint
        if expected != found:
            differ = sorted(k for k in expected.keys() | found.keys() if expected.get(k) != found.get(k))
            raise RunLogError(
                f"{self.run_dir}: the log was written by a different agent configuration "
                f"({', '.join(differ)} differ: log {[found.get(k) for k in differ]}, "
                f"agent {[expected.get(k) for k in differ]})"
            )
        if self.state.finished:
            if self.agent.output is not None:
                self.final_value, _ = self.agent.output.validate(self.state.content)
            else:
                self.final_value = self.state.output
            return self.result()
        self.record("run_resumed")
        return await self.drive()

    # ---- the loop -------------------------------------------------------------------------

    async def drive(self) -> RunResult:
        try:
            while not self.state.finished:
                last = self.state.messages[-1] if self.state.messages else {}
                if self.state.pending:
                    await self.answer_calls()
                elif self.state.invalid_calls:
                    self.repair_calls()
                elif last.get("role") == "assistant" and not last.get("tool_calls"):
                    self.conclude(last)
                else:
                    await self.step()
        except (LimitExceeded, ModelRequestError, OutputValidationError) as error:
            self.record("run_failed", error=str(error), kind=type(error).__name__)
            if isinstance(error, LimitExceeded | OutputValidationError):
                error.messages = list(self.state.messages)
            raise
        return self.result()

    def record(self, event_type: str, /, **data: Any) -> Event:
        event = Event(event_type, data)
        if self.log is not None:
            event = self.log.append(event)
        self.state.apply(event)
        self.emit(event)
        return event

    def sync(self) -> None:
        """Make the logged events durable; called before the run acts outside this process."""
        if self.log is not None:
            self.log.sync()

    def emit(self, event: Event) -> None:
        if self.publish is not None:
            self.publish(event)
        if self.observe is not None:
            self.observe(event)

    def elapsed(self) -> float:
        return time.monotonic() - self.started

    def remaining_s(self) -> float | None:
        wall = self.limits.wall_clock_s
        return None if wall is None else wall - self.elapsed()

    def check_limits(self) -> None:
        lim, st = self.limits, self.state
        if lim.max_steps is not None and st.steps >= lim.max_steps:
            raise LimitExceeded(
                f"max_steps reached: the run made {st.steps} model requests (limit {lim.max_steps})"
            )
        left = self.remaining_s()
        if left is not None and left <= 0:
            raise LimitExceeded(
                f"wall_clock_s reached: the run took {self.elapsed():.1f} s (limit {lim.wall_clock_s:g} s)"
            )
        if lim.max_total_tokens is not None and st.usage.total_tokens >= lim.max_total_tokens:
            raise LimitExceeded(
                f"max_total_tokens reached: the run used {st.usage.total_tokens} tokens "
                f"(limit {lim.max_total_tokens})"
            )

    async def step(self) -> None:
        self.check_limits()
        last = self.state.messages[-1] if self.state.messages else {}
        if self.agent.reminder is not None and last.get("role") != "latest_reminder":
            text = self.agent.reminder(
                ReminderContext(
                    step=self.state.steps + 1,
                    tool_calls=self.state.tool_calls,
                    total_tokens=self.state.usage.total_tokens,
                    elapsed_s=self.elapsed(),
                    messages=tuple(self.state.messages),
                )
            )
            if text:
                self.record(
                    "message", message={"role": "latest_reminder", "content": text}, reason="reminder"
                )
        self.sync()
        body = self.build_request()
        self.emit(Event("step_started", {"step": self.state.steps + 1, "max_tokens": body.get("max_tokens")}))
        reply = await self.request_model(body)
        for warning in reply.warnings:
            self.emit(Event("warning", {"message": warning}))
        self.record(
            "model_response",
            step=self.state.steps + 1,
            message=reply.message,
            finish_reason=reply.finish_reason,
            usage=reply.usage,
            warnings=reply.warnings,
            **({"invalid_tool_calls": reply.invalid_calls} if reply.invalid_calls else {}),
        )

    def conclude(self, message: dict[str, Any]) -> None:
        content = message.get("content") or ""
        spec = self.agent.output
        if (markup := unparsed_calls(content)) is not None:
            self.repair(
                calls_repair_prompt(),
                f"the final answer {markup} ({self.state.repairs} repair turns allowed); is the "
                "server started with --tool-call-parser deepseekv41?",
                content,
            )
            return
        if spec is None:
            value: Any = content
        else:
            value, problem = spec.validate(content)
            if problem is not None:
                self.repair(
                    repair_prompt(problem),
                    f"the final answer never matched the output schema {spec.name!r} "
                    f"({self.state.repairs} repair turns allowed): {problem}",
                    content,
                )
                return
        self.final_value = value
        self.record(
            "run_finished",
            output=to_jsonable(value),
            content=content,
            finish_reason=self.state.last_finish_reason,
        )

    def repair(self, prompt: str, failure: str, content: str) -> None:
        """A repair turn for a final answer that cannot be used, while the budget lasts."""
        if self.state.repairs >= self.agent.max_output_repairs:
            raise OutputValidationError(failure, content)
        self.record("message", message={"role": "user", "content": prompt}, reason="repair")

    def result(self) -> RunResult:
        st = self.state
        return RunResult(
            final_output=self.final_value,
            content=st.content,
            messages=list(st.messages),
            usage=st.usage,
            steps=st.steps,
            tool_calls=st.tool_calls,
            finish_reason=st.last_finish_reason,
            run_dir=self.run_dir,
            warnings=list(st.warnings),
            approvals=list(st.approvals),
        )

    # ---- model requests -------------------------------------------------------------------

    def build_request(self) -> dict[str, Any]:
        agent = self.agent
        settings = dict(agent.model_settings)
        extra_body = dict(settings.pop("extra_body", None) or {})
        extra_body.setdefault("thinking", {"type": "enabled" if agent.thinking else "disabled"})
        extra_body.setdefault("chat_template_kwargs", {"thinking": agent.thinking})
        if agent.thinking_token_budget is not None:
            extra_body.setdefault("thinking_token_budget", agent.thinking_token_budget)
        if "max_tokens" not in settings and "max_completion_tokens" not in settings:
            settings["max_tokens"] = DEFAULT_MAX_TOKENS
        elif "max_tokens" in settings and settings["max_tokens"] is None:
            del settings["max_tokens"]
        body: dict[str, Any] = {"model": agent.model, "messages": list(self.state.messages), **settings}
        if agent.tools:
            body["tools"] = [tool.to_openai() for tool in agent.tools]
            if agent.tool_choice != "auto":
                body["tool_choice"] = agent.tool_choice
        if agent.output is not None:
            # Sent on every step, not only the last: it is part of the first system block of the
            # prompt, so changing it between steps would change the whole prompt prefix.
            body["response_format"] = agent.output.response_format()
        if agent.thinking and agent.reasoning_effort is not None:
            body["reasoning_effort"] = agent.reasoning_effort
        budget = self.limits.max_total_tokens
        if budget is not None:
            left = budget - self.state.usage.total_tokens
            body["max_tokens"] = min(body.get("max_tokens") or left, left)
        body["extra_body"] = extra_body
        return body

    async def request_model(self, body: dict[str, Any]) -> _Reply:
        policy = self.agent.policies.retry
        attempt = 0
        while True:
            attempt += 1
            timeout = self.remaining_s()
            try:
                if self.publish is not None:
                    return await self.streamed_completion(body, timeout)
                return await self.completion(body, timeout)
            except Exception as error:
                if isinstance(error, openai.APIStatusError) and not policy.retryable(error):
                    raise ModelRequestError(
                        f"the server rejected the request (HTTP {error.status_code}): {_api_message(error)}"
                    ) from None
                if not policy.retryable(error):
                    raise
                if attempt >= policy.max_attempts:
                    raise ModelRequestError(
                        f"model request failed after {attempt} attempts: {type(error).__name__}: {error}"
                    ) from None
                delay = policy.delay_s(attempt, error)
                left = self.remaining_s()
                if left is not None and delay >= left:
                    raise LimitExceeded(
                        f"wall_clock_s reached while retrying the model request ({error})"
                    ) from None
                self.emit(Event("retry", {"attempt": attempt, "delay_s": delay, "error": str(error)}))
                await asyncio.sleep(delay)

    async def completion(self, body: dict[str, Any], timeout: float | None) -> _Reply:
        response = await post_completion(self.client, body, timeout)
        if not response.choices:
            raise ModelRequestError("the server returned a completion without choices")
        choice = response.choices[0]
        msg = choice.message
        calls = [
            {
                "id": c.id,
                "type": "function",
                "function": {"name": c.function.name, "arguments": c.function.arguments},
            }
            for c in msg.tool_calls or []
        ]
        reasoning = getattr(msg, "reasoning_content", None)
        invalid = (msg.model_extra or {}).get(INVALID_TOOL_CALLS) or []
        usage = _usage(response.usage)
        return self.reply(msg.content, reasoning, calls, choice.finish_reason, usage, invalid)

    async def streamed_completion(self, body: dict[str, Any], timeout: float | None) -> _Reply:
        stream = await post_streamed(self.client, body, timeout)
        content: list[str] = []
        reasoning: list[str] | None = None
        calls: dict[int, dict[str, Any]] = {}
        invalid: list[dict[str, Any]] = []
        finish, usage = None, None
        async for chunk in stream:
            if chunk.usage is not None:
                usage = _usage(chunk.usage)
            for choice in chunk.choices:
                delta = choice.delta
                piece = getattr(delta, "reasoning_content", None)
                if piece is not None:
                    if reasoning is None:
                        reasoning = []
                    reasoning.append(piece)
                    if piece:
                        self.emit(Event("reasoning_delta", {"text": piece}))
                if delta.content:
                    content.append(delta.content)
                    self.emit(Event("content_delta", {"text": delta.content}))
                invalid += (delta.model_extra or {}).get(INVALID_TOOL_CALLS) or []
                for tc in delta.tool_calls or []:
                    slot = calls.setdefault(tc.index, {"id": "", "name": "", "arguments": ""})
                    fn = tc.function
                    if tc.id:
                        slot["id"] = tc.id
                    if fn is not None and fn.name and slot["name"] != fn.name:
                        slot["name"] += fn.name
                    if fn is not None and fn.arguments:
                        slot["arguments"] += fn.arguments
                    self.emit(
                        Event(
                            "tool_call_delta",
                            {
                                "index": tc.index,
                                "name": slot["name"],
                                "arguments": fn.arguments if fn else "",
                            },
                        )
                    )
                if choice.finish_reason:
                    finish = choice.finish_reason
        if finish is None:
            raise IncompleteStream("the streamed response ended before its finish_reason")
        tool_calls = [
            {
                "id": c["id"],
                "type": "function",
                "function": {"name": c["name"], "arguments": c["arguments"]},
            }
            for i, c in sorted(calls.items())
        ]
        joined = "".join(reasoning) if reasoning is not None else None
        return self.reply("".join(content), joined, tool_calls, finish, usage, invalid)

    def reply(
        self,
        content: str | None,
        reasoning: str | None,
        calls: list[dict[str, Any]],
        finish: str | None,
        usage: dict[str, Any] | None,
        invalid: list[dict[str, Any]],
    ) -> _Reply:
        message: dict[str, Any] = {"role": "assistant", "content": content or ""}
        warnings = []
        if reasoning is not None or self.agent.thinking:
            # Kept on every turn: the DeepSeek renderer re-reads it for every turn of a tool loop.
            message["reasoning_content"] = reasoning or ""
            if reasoning is None and calls:
                warnings.append(
                    "thinking is on but the server sent no reasoning_content with a tool call; is it "
                    "started with --reasoning-parser deepseek-v41?"
                )
        if calls:
            message["tool_calls"] = self.unique_ids(calls)
        invalid_calls = [_invalid_call(entry) for entry in invalid]
        return _Reply(message, finish or "stop", usage, warnings, invalid_calls)

    def unique_ids(self, calls: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """The calls with ids unique in the run: a tool result is matched to its call by id, so
        a missing id (a server that omits them) or one a server reuses on a later turn would
        pair an output with another call (its tool, and whether its output is trusted)."""
        used = {c["id"] for m in self.state.messages for c in m.get("tool_calls") or []}
        turn = sum(1 for m in self.state.messages if m.get("role") == "assistant")
        for index, call in enumerate(calls):
            if not call["id"] or call["id"] in used:
                fresh = f"call_{turn}_{index}"
                while fresh in used:
                    fresh += "_"
                call["id"] = fresh
            used.add(call["id"])
        return calls

    def repair_calls(self) -> None:
        """A repair turn for the calls the server flagged as malformed: none of them ran."""
        calls = self.state.invalid_calls
        lines = [f"- {c['name'] or '(a call without a name)'}: {c['error']}" for c in calls]
        self.record(
            "message",
            message={"role": "user", "content": MALFORMED + "\n".join(lines)},
            reason="tool_call_repair",
            names=[c["name"] for c in calls],
        )
        self.check_retry_budgets()

    # ---- tool calls -----------------------------------------------------------------------

    async def answer_calls(self) -> None:
        agent, st = self.agent, self.state
        open_calls = [c for c in st.pending if c.result is None]
        if st.last_finish_reason == "length":
            for call in open_calls:  # a call cut by the token limit is never executed
                self.finish_call(call, "truncated", TRUNCATED)
            return
        for call in open_calls:
            if call.started and not (agent.tool(call.name) and agent.tool(call.name).idempotent):
                self.finish_call(call, "interrupted", INTERRUPTED)
        open_calls = [c for c in open_calls if c.result is None]
        limit = self.limits.max_tool_calls
        if limit is not None and st.tool_calls + len(open_calls) > limit:
            raise LimitExceeded(
                f"max_tool_calls reached: the model asked for {len(open_calls)} more calls after "
                f"{st.tool_calls} (limit {limit})"
            )
        if not self.limits.parallel_tool_calls:
            for call in open_calls:
                prepared = self.prepare(call)
                if prepared is not None:
                    self.mark_started(call)
                    self.sync()
                    await self.execute(prepared)
        else:
            # Every call is prepared (and any approval asked) before the first is marked started:
            # a run stopped while an approver thinks has started nothing.
            ready = [(call, prepared) for call in open_calls if (prepared := self.prepare(call)) is not None]
            for call, _ in ready:
                self.mark_started(call)
            if ready:
                self.sync()
                await asyncio.gather(*(self.execute(prepared) for _, prepared in ready))
        self.check_retry_budgets()

    def mark_started(self, call: PendingCall) -> None:
        if not call.started:
            self.record("tool_started", call_id=call.id, name=call.name, arguments=call.arguments)

    def prepare(self, call: PendingCall) -> PreparedCall | None:
        tool = self.agent.tool(call.name)
        if tool is None:
            names = ", ".join(t.name for t in self.agent.tools) or "none"
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
        guard = self.agent.policies.untrusted_policy(self.agent.tools)
        return guard.review(tool, arguments, self.sources()) if guard is not None else None

    def approved(self, call: PendingCall, arguments: dict[str, Any], why: Hold) -> bool:
        """The approval policy's answer, asked once per call and logged (a resumed run reuses it)."""
        if call.approval is not None:
            return call.approval
        granted = ask(self.agent.policies.approval, call.name, arguments, why)
        self.record(
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
        length = len(self.state.messages)
        if self._sources is None or self._sources[0] != length:
            tools = {t.name: t for t in self.agent.tools}
            state = self.state
            self._sources = (length, Sources.of(state.messages, tools, state.runner_turns, state.unreached))
        return self._sources[1]

    async def execute(self, prepared: PreparedCall) -> None:
        tool = prepared.tool
        timeout = tool.timeout_s if tool.timeout_s is not None else self.limits.tool_timeout_s
        left = self.remaining_s()
        if left is not None:
            timeout = max(min(timeout, left), 0.001)
        executor = self.agent.policies.executor_for(tool.isolation)
        ctx = ToolContext(prepared.call_id, tool.name, self.run_dir)
        outcome = await executor.execute(prepared, ctx, timeout)
        call = next(c for c in self.state.pending if c.id == prepared.call_id)
        self.finish_call(call, outcome.status, outcome.text)

    def finish_call(self, call: PendingCall, status: str, text: str) -> None:
        cap = self.limits.max_tool_result_chars
        if len(text) > cap:
            text = text[:cap] + f"\n[truncated: {len(text) - cap} more characters]"
        self.record("tool_finished", call_id=call.id, name=call.name, status=status, result=text)

    def check_retry_budgets(self) -> None:
        for name, failures in self.state.failures.items():
            tool = self.agent.tool(name)
            if tool is not None and failures > tool.max_retries:
                raise LimitExceeded(
                    f"tool {name!r} failed {failures} times (retry budget {tool.max_retries}); "
                    f"last result: {self.last_result(name)}"
                )

    def last_result(self, name: str) -> str:
        ids = {
            c["id"]
            for m in self.state.messages
            for c in m.get("tool_calls") or []
            if c["function"]["name"] == name
        }
        for message in reversed(self.state.messages):
            if message.get("role") == "tool" and message.get("tool_call_id") in ids:
                return str(message.get("content"))[:200]
        return ""


def _invalid_call(entry: Any) -> dict[str, Any]:
    """One `invalid_tool_calls` entry of the server (sglang-ds41's plugin) as the log keeps it."""
    entry = entry if isinstance(entry, dict) else {}
    function = entry.get("function") if isinstance(entry.get("function"), dict) else {}
    return {
        "id": str(entry.get("id") or ""),
        "name": str(function.get("name") or ""),
        "arguments": str(function.get("arguments") or ""),
        "error": str(entry.get("error") or "malformed call"),
    }


def _usage(usage: Any) -> dict[str, Any] | None:
    if usage is None:
        return None
    details = getattr(usage, "completion_tokens_details", None)
    return {
        "prompt_tokens": usage.prompt_tokens,
        "completion_tokens": usage.completion_tokens,
        "total_tokens": usage.total_tokens,
        "reasoning_tokens": getattr(details, "reasoning_tokens", None) or 0,
    }


def _api_message(error: openai.APIStatusError) -> str:
    body = error.body
    if isinstance(body, dict):
        inner = body.get("error", body)
        if isinstance(inner, dict) and inner.get("message"):
            return str(inner["message"])
    return str(error.message)
