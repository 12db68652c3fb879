"""The model turn of an agent run: one request to the model and what its answer is.

A step sends the transcript (with the agent's settings, tools, output schema and token budget)
and logs the response: its message, finish reason, usage, and the calls the server flagged as
malformed (`invalid_tool_calls`, never executed). Transport errors are retried by the retry
policy, within the run's wall clock; streamed runs publish the deltas as they arrive. An answer
without calls is the final answer once it is usable: validated against the output type, with
bounded repair turns (raw DSML markup in content is never one).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import openai

from .agent import ReminderContext
from .errors import IncompleteStream, LimitExceeded, ModelRequestError, OutputValidationError
from .events import Event
from .output import calls_repair_prompt, repair_prompt, to_jsonable, unparsed_calls
from .transport import post_completion, post_streamed

if TYPE_CHECKING:
    from .runner import _Loop

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


# The server's extension field for calls it could not parse (sglang_ds41/plugin/serving/parsers.py).
INVALID_TOOL_CALLS = "invalid_tool_calls"


@dataclass(frozen=True)
class _Reply:
    message: dict[str, Any]
    finish_reason: str
    usage: dict[str, Any] | None
    warnings: list[str]
    invalid_calls: list[dict[str, Any]]


class ModelTurn:
    """The model's side of a run's loop: `step` asks, `conclude` takes a final answer."""

    def __init__(self, loop: _Loop) -> None:
        self.loop = loop

    async def step(self) -> None:
        self.loop.check_limits()
        last = self.loop.state.messages[-1] if self.loop.state.messages else {}
        if self.loop.agent.reminder is not None and last.get("role") != "latest_reminder":
            text = self.loop.agent.reminder(
                ReminderContext(
                    step=self.loop.state.steps + 1,
                    tool_calls=self.loop.state.tool_calls,
                    total_tokens=self.loop.state.usage.total_tokens,
                    elapsed_s=self.loop.elapsed(),
                    messages=tuple(self.loop.state.messages),
                )
            )
            if text:
                self.loop.record(
                    "message", message={"role": "latest_reminder", "content": text}, reason="reminder"
                )
        self.loop.sync()
        body = self.build_request()
        step = self.loop.state.steps + 1
        self.loop.emit(Event("step_started", {"step": step, "max_tokens": body.get("max_tokens")}))
        reply = await self.request_model(body)
        for warning in reply.warnings:
            self.loop.emit(Event("warning", {"message": warning}))
        self.loop.record(
            "model_response",
            step=self.loop.state.steps + 1,
            message=reply.message,
            finish_reason=reply.finish_reason,
            usage=reply.usage,
            warnings=reply.warnings,
            **({"invalid_tool_calls": reply.invalid_calls} if reply.invalid_calls else {}),
        )

    def conclude(self, message: dict[str, Any]) -> None:
        content = message.get("content") or ""
        spec = self.loop.agent.output
        if (markup := unparsed_calls(content)) is not None:
            self.repair(
                calls_repair_prompt(),
                f"the final answer {markup} ({self.loop.state.repairs} repair turns allowed); is the "
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
                    f"({self.loop.state.repairs} repair turns allowed): {problem}",
                    content,
                )
                return
        self.loop.final_value = value
        self.loop.record(
            "run_finished",
            output=to_jsonable(value),
            content=content,
            finish_reason=self.loop.state.last_finish_reason,
        )

    def repair(self, prompt: str, failure: str, content: str) -> None:
        """A repair turn for a final answer that cannot be used, while the budget lasts."""
        if self.loop.state.repairs >= self.loop.agent.max_output_repairs:
            raise OutputValidationError(failure, content)
        self.loop.record("message", message={"role": "user", "content": prompt}, reason="repair")

    def build_request(self) -> dict[str, Any]:
        agent = self.loop.agent
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
        body: dict[str, Any] = {"model": agent.model, "messages": list(self.loop.state.messages), **settings}
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
        budget = self.loop.limits.max_total_tokens
        if budget is not None:
            left = budget - self.loop.state.usage.total_tokens
            body["max_tokens"] = min(body.get("max_tokens") or left, left)
        body["extra_body"] = extra_body
        return body

    async def request_model(self, body: dict[str, Any]) -> _Reply:
        policy = self.loop.agent.policies.retry
        attempt = 0
        while True:
            attempt += 1
            timeout = self.loop.remaining_s()
            try:
                if self.loop.publish is not None:
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
                left = self.loop.remaining_s()
                if left is not None and delay >= left:
                    raise LimitExceeded(
                        f"wall_clock_s reached while retrying the model request ({error})"
                    ) from None
                self.loop.emit(Event("retry", {"attempt": attempt, "delay_s": delay, "error": str(error)}))
                await asyncio.sleep(delay)

    async def completion(self, body: dict[str, Any], timeout: float | None) -> _Reply:
        response = await post_completion(self.loop.client, body, timeout)
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
        stream = await post_streamed(self.loop.client, body, timeout)
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
                        self.loop.emit(Event("reasoning_delta", {"text": piece}))
                if delta.content:
                    content.append(delta.content)
                    self.loop.emit(Event("content_delta", {"text": delta.content}))
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
                    self.loop.emit(
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
        if reasoning is not None or self.loop.agent.thinking:
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
        used = {c["id"] for m in self.loop.state.messages for c in m.get("tool_calls") or []}
        turn = sum(1 for m in self.loop.state.messages if m.get("role") == "assistant")
        for index, call in enumerate(calls):
            if not call["id"] or call["id"] in used:
                fresh = f"call_{turn}_{index}"
                while fresh in used:
                    fresh += "_"
                call["id"] = fresh
            used.add(call["id"])
        return calls

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
