"""`Runner`: the agent loop (sync, async, streamed) and `resume` from an event log.

One step: (optional `latest_reminder`) -> model request (retried on transport errors) ->
response logged -> its tool calls answered in call order -> next step; a response without calls
is the final answer (validated against the output type, with bounded repair turns). Calls the
server flags as malformed (`invalid_tool_calls`: broken arguments, cut off by `max_tokens`) are
never executed: the runner answers them with a repair turn naming each problem, and they count
against their tool's retry budget.

The loop is driven by the state rebuilt from events (events.py), which makes resume the same
code path as a fresh run: whatever the log says is done is not done again. Each step is the
model's turn (`model_turn.py`: the request and its answer) or the tools' (`tool_turn.py`:
the calls answered); this module holds the loop between them, its events and its limits.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import openai

from .agent import Agent
from .errors import (
    AgentConfigError,
    LimitExceeded,
    ModelRequestError,
    OutputValidationError,
    RunLogError,
)
from .events import Event, RunState
from .log import EventLog, read_log
from .model_turn import ModelTurn
from .result import RunResult
from .tool_turn import ToolTurn

Input = str | list[dict[str, Any]]


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


class _Loop:
    """One run: its state rebuilt from events, the events it records, its limits; each step is
    the model's turn (`model_turn.py`) or the tools' (`tool_turn.py`)."""

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
        self.model = ModelTurn(self)
        self.tools = ToolTurn(self)

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
                    await self.tools.answer_calls()
                elif self.state.invalid_calls:
                    self.tools.repair_calls()
                elif last.get("role") == "assistant" and not last.get("tool_calls"):
                    self.model.conclude(last)
                else:
                    await self.model.step()
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
