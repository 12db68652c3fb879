"""OpenAI Chat Completions request -> Conversation (ENCODING.md §2.1, §3).

Accepts and rejects exactly what the official renderer (`deepseek-recipe` 0.2.0, model
`DeepSeek-V4.1-Flash`) accepts and rejects, in two passes like it: a type pass (wrong JSON
types, unknown enum words; `EncodingError.status_code` None) and a semantic pass (400).

Two extensions of our own, whose rules live in `reasoning.py` (shared with the server):
`"reasoning_budget": N` (an integer 1-100, not a bool) sets the number in the effort line
directly (the official Python encoder and SGLang accept such budgets; the wheel only renders
50/75/100). It overrides `reasoning_effort`. It needs thinking mode: with thinking disabled it
is an error rather than being silently dropped. `"thinking_token_budget": N` is checked here
(a server enforces it, ENCODING.md §4.4) and leaves the prompt unchanged.

Not reproduced: the V4 model name `DeepSeek-V4-Pro` (its prompt format differs; rejected
here), struct fields given as JSON arrays (serde accepts `["enabled", null]` for `thinking`),
and duplicate top-level keys in JSON text. `strict: true` tools are rewritten by
`strict_schema.py`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from . import json_text, reasoning
from .conversation import (
    AssistantMessage,
    Conversation,
    ImagePart,
    LatestReminderMessage,
    Message,
    Part,
    SystemMessage,
    ToolCall,
    ToolDefinition,
    ToolMessage,
    UserMessage,
)
from .errors import EncodingError
from .image_url import image_source, image_url_problem
from .schema_check import schema_problem
from .serde_checks import (
    body_error,
    describe,
    expect_enum,
    expect_list,
    expect_object,
    expect_str,
    optional_bool,
    optional_f32,
    optional_str,
    optional_uint,
    required,
)
from .strict_schema import StrictSchemaError, strict_parameters, strict_response_schema

MODEL_NAME = "DeepSeek-V4.1-Flash"
KNOWN_MODELS = ("DeepSeek-V4-Pro", MODEL_NAME)
MAX_TOKENS_BOUND = 393216
ROLES = ("system", "user", "assistant", "tool", "latest_reminder")
EFFORT_WORDS = ("none", "minimal", "low", "medium", "high", "xhigh", "ultra", "max")
# Named efforts -> the N of "Reasoning Effort: N" (ENCODING.md §2.3).
EFFORT_BUDGET = {
    "minimal": 50,
    "low": 50,
    "medium": 75,
    "high": 75,
    "xhigh": 75,
    "ultra": 100,
    "max": 100,
}
DEFAULT_BUDGET = 75
TOOL_NAME = re.compile(r"[a-zA-Z0-9_-]+")
JSON_WORD = re.compile("json", re.IGNORECASE)


def request_error(message: str) -> EncodingError:
    return EncodingError(message, status_code=400)


@dataclass(frozen=True)
class RequestSettings:
    """Everything a request renders besides its messages, validated and converted."""

    thinking: bool
    reasoning_budget: int | None
    tools: tuple[ToolDefinition, ...]
    tool_choice: str
    response_format: str
    response_schema: Any
    response_regex: str | None
    declares_tools: bool  # the request lists tools (also when tool_choice "none" drops them)

    def conversation(self, messages: tuple[Message, ...] | list[Message] = ()) -> Conversation:
        return Conversation(
            messages=tuple(messages),
            thinking=self.thinking,
            reasoning_budget=self.reasoning_budget,
            tools=self.tools,
            tool_choice=self.tool_choice,  # type: ignore[arg-type]
            response_format=self.response_format,  # type: ignore[arg-type]
            response_schema=self.response_schema,
            response_regex=self.response_regex,
        )


def conversation_from_request(body: Any) -> Conversation:
    """Validate a Chat Completions body (dict, or JSON text) and build its Conversation."""
    body = _as_json_object(body)
    model = expect_str(required(body, "model", "model"), "model")
    raw_messages = expect_list(required(body, "messages", "messages"), "messages")
    messages = [typed_message(m, i) for i, m in enumerate(raw_messages)]
    typed = _typed_settings(body)
    _check_model(model)
    if not messages:
        raise request_error("Empty input messages")

    converter = MessageConverter()
    conv_messages = [m for i, typed_m in enumerate(messages) if (m := converter.add(typed_m, i))]
    converter.finish()
    settings = _converted_settings(typed)
    converter.check_settings(settings)
    return settings.conversation(conv_messages)


def request_settings(body: dict[str, Any]) -> RequestSettings:
    """The settings of a request body (a JSON object; its messages are not looked at)."""
    model = expect_str(required(body, "model", "model"), "model")
    typed = _typed_settings(body)
    _check_model(model)
    return _converted_settings(typed)


def _typed_settings(body: dict[str, Any]) -> tuple[Any, ...]:
    """The type pass of everything but the messages (and the sampling fields' range checks)."""
    tools = _typed_tools(body.get("tools"))
    choice = _typed_tool_choice(body.get("tool_choice"))
    response = _typed_response_format(body.get("response_format"))
    thinking, budget = _thinking_and_budget(body)
    _check_sampling_fields(body, thinking)
    return tools, choice, response, thinking, budget, body.get("response_format") is not None


def _check_model(model: str) -> None:
    if model not in KNOWN_MODELS:
        raise request_error(
            f"The supported API model names are DeepSeek-V4-Pro, DeepSeek-V4.1-Flash, but you passed {model}."
        )
    if model != MODEL_NAME:
        raise request_error(
            f"model {model!r} uses the DeepSeek-V4 prompt format, which this renderer does not"
            f" implement; use {MODEL_NAME!r}"
        )


def _converted_settings(typed: tuple[Any, ...]) -> RequestSettings:
    tools, choice, response, thinking, budget, has_response_format = typed
    conv_tools, tool_choice = _convert_tools(tools, choice, thinking, has_response_format)
    response_format, response_schema, response_regex, response_strict = response
    if response_format == "json_schema":
        _check_response_schema(response_schema, strict=response_strict)
    return RequestSettings(
        thinking=thinking,
        reasoning_budget=budget if thinking else None,
        tools=tuple(conv_tools),
        tool_choice=tool_choice,
        response_format=response_format,
        response_schema=response_schema,
        response_regex=response_regex,
        declares_tools=bool(tools),
    )


# --- the type pass ------------------------------------------------------------------------


def _as_json_object(body: Any) -> dict[str, Any]:
    if isinstance(body, (str, bytes)):
        try:
            body = json_text.loads(body)
        except json_text.JsonTextError as error:
            raise EncodingError(f"invalid request body: {error}", status_code=None) from None
    else:
        try:
            json_text.check_value(body)
        except json_text.JsonTextError as error:
            raise EncodingError(f"invalid request body: {error}", status_code=None) from None
    return expect_object(body, "request body")


def _typed_parts(content: Any, path: str) -> list[dict[str, Any]] | str:
    """String content stays a string; a list becomes checked part dicts."""
    if isinstance(content, str):
        return content
    if not isinstance(content, (list, tuple)):
        raise body_error(f"{path}.content", "content should be a string or a list")
    parts = []
    for i, part in enumerate(content):
        where = f"{path}.content[{i}]"
        part = expect_object(part, where)
        kind = expect_enum(required(part, "type", where), f"{where}.type", ("text", "image_url", "file"))
        if kind == "text":
            expect_str(required(part, "text", where), f"{where}.text")
        elif kind == "image_url":
            image = expect_object(required(part, "image_url", where), f"{where}.image_url")
            expect_str(required(image, "url", f"{where}.image_url"), f"{where}.image_url.url")
            detail = image.get("detail")
            if detail is not None:
                expect_enum(detail, f"{where}.image_url.detail", ("low", "high", "original", "auto"))
        parts.append(part)
    return parts


def typed_message(message: Any, index: int) -> dict[str, Any]:
    """The type pass of `messages[index]`."""
    path = f"messages[{index}]"
    message = expect_object(message, path)
    role = expect_enum(required(message, "role", path), f"{path}.role", ROLES)
    optional_str(message.get("name"), f"{path}.name")
    checked: dict[str, Any] = {"role": role, "path": path}
    if role == "assistant":
        content = message.get("content")
        checked["content"] = None if content is None else _typed_parts(content, path)
        checked["reasoning_content"] = optional_str(
            message.get("reasoning_content"), f"{path}.reasoning_content"
        )
        checked["prefix"] = bool(optional_bool(message.get("prefix"), f"{path}.prefix"))
        calls = message.get("tool_calls")
        checked["tool_calls"] = None if calls is None else _typed_calls(calls, f"{path}.tool_calls")
        return checked
    content = required(message, "content", path)
    if role == "latest_reminder":
        checked["content"] = expect_str(content, f"{path}.content")
        return checked
    checked["content"] = _typed_parts(content, path)
    if role == "tool":
        checked["tool_call_id"] = expect_str(required(message, "tool_call_id", path), f"{path}.tool_call_id")
    return checked


def _typed_calls(calls: Any, path: str) -> list[ToolCall]:
    result = []
    for i, call in enumerate(expect_list(calls, path)):
        where = f"{path}[{i}]"
        call = expect_object(call, where)
        call_id = expect_str(required(call, "id", where), f"{where}.id")
        expect_enum(required(call, "type", where), f"{where}.type", ("function",))
        function = expect_object(required(call, "function", where), f"{where}.function")
        name = expect_str(required(function, "name", f"{where}.function"), f"{where}.function.name")
        arguments = expect_str(
            required(function, "arguments", f"{where}.function"), f"{where}.function.arguments"
        )
        result.append(ToolCall(id=call_id, name=name, arguments=arguments))
    return result


def _typed_tools(tools: Any) -> list[dict[str, Any]]:
    if tools is None:
        return []
    result = []
    for i, tool in enumerate(expect_list(tools, "tools")):
        where = f"tools[{i}]"
        tool = expect_object(tool, where)
        expect_enum(required(tool, "type", where), f"{where}.type", ("function",))
        function = expect_object(required(tool, "function", where), f"{where}.function")
        name = expect_str(required(function, "name", f"{where}.function"), f"{where}.function.name")
        description = optional_str(function.get("description"), f"{where}.function.description")
        strict = optional_bool(function.get("strict"), f"{where}.function.strict")
        result.append(
            {
                "name": name,
                "description": description,
                "parameters": function.get("parameters"),
                "strict": bool(strict),
                "index": i,
            }
        )
    return result


def _typed_tool_choice(choice: Any) -> str | tuple[str, str]:
    """ "auto" / "none" / "required", or ("named", tool name)."""
    if choice is None:
        return "auto"
    if isinstance(choice, str) and choice in ("none", "auto", "required"):
        return choice
    if isinstance(choice, dict) and choice.get("type") == "function":
        function = choice.get("function")
        if isinstance(function, dict) and isinstance(function.get("name"), str):
            return ("named", function["name"])
    raise body_error("tool_choice", "expected one of `none`, `auto`, `required` or a tool")


def _typed_response_format(fmt: Any) -> tuple[str, Any, str | None, bool]:
    """(kind, json_schema.schema, regex, json_schema.strict)."""
    if fmt is None:
        return "text", None, None, False
    fmt = expect_object(fmt, "response_format")
    kind = expect_enum(
        required(fmt, "type", "response_format"),
        "response_format.type",
        ("json_object", "json_schema", "regex", "text"),
    )
    if kind == "json_schema":
        spec = expect_object(required(fmt, "json_schema", "response_format"), "response_format.json_schema")
        optional_str(spec.get("name"), "response_format.json_schema.name")
        strict = optional_bool(spec.get("strict"), "response_format.json_schema.strict")
        return kind, required(spec, "schema", "response_format.json_schema"), None, bool(strict)
    if kind == "regex":
        regex = expect_str(required(fmt, "regex", "response_format"), "response_format.regex")
        return kind, None, regex, False
    return kind, None, None, False


def _thinking_and_budget(body: dict[str, Any]) -> tuple[bool, int]:
    """Thinking on/off and the effort number (ENCODING.md §2.1 table, §2.3)."""
    explicit = reasoning.thinking_from_field(body.get("thinking"))
    effort = _typed_effort(body.get("reasoning_effort"))
    budget = reasoning.reasoning_budget(body.get(reasoning.REASONING_BUDGET))
    reasoning.request_token_budget(body)  # the server enforces it; it does not change the prompt

    on = explicit if explicit is not None else effort != "none"
    off_because = "thinking.type is disabled" if explicit is not None else "reasoning_effort is none"
    reasoning.check_budget_has_thinking(budget, on, off_because)
    if budget is None:
        budget = EFFORT_BUDGET.get(effort or "high", DEFAULT_BUDGET)
    return on, budget


def _typed_effort(effort: Any) -> str | None:
    if effort is None:
        return None
    if isinstance(effort, dict):
        if len(effort) != 1:
            raise body_error("reasoning_effort", "invalid value: map, expected map with a single key")
        ((effort, unit),) = effort.items()
        if unit is not None:
            raise body_error("reasoning_effort", f"invalid type: {describe(unit)}, expected unit")
    elif not isinstance(effort, str):
        raise body_error("reasoning_effort", f"invalid type: {describe(effort)}, expected string or map")
    return expect_enum(effort, "reasoning_effort", EFFORT_WORDS)


def _check_sampling_fields(body: dict[str, Any], thinking: bool) -> None:
    """The wheel's sampling-field checks: types first (no status), then ranges (400)."""
    temperature = optional_f32(body.get("temperature"), "temperature")
    top_p = optional_f32(body.get("top_p"), "top_p")
    presence = optional_f32(body.get("presence_penalty"), "presence_penalty")
    frequency = optional_f32(body.get("frequency_penalty"), "frequency_penalty")
    max_tokens = optional_uint(body.get("max_tokens"), "max_tokens", 32)
    n = optional_uint(body.get("n"), "n", 8)
    top_logprobs = optional_uint(body.get("top_logprobs"), "top_logprobs", 8)
    logprobs = optional_bool(body.get("logprobs"), "logprobs")
    seed = optional_uint(body.get("seed"), "seed", 64)
    stream = optional_bool(body.get("stream"), "stream")
    optional_bool(body.get("parallel_tool_calls"), "parallel_tool_calls")
    stream_options = body.get("stream_options")
    if stream_options is not None:
        stream_options = expect_object(stream_options, "stream_options")
        optional_bool(stream_options.get("include_usage"), "stream_options.include_usage")
    stop = body.get("stop")
    stops: list[str] = []
    if stop is not None:
        if isinstance(stop, str):
            stops = [stop]
        elif isinstance(stop, (list, tuple)):
            stops = [expect_str(s, f"stop[{i}]") for i, s in enumerate(stop)]
        else:
            raise body_error("stop", "expected a string or a list")

    def out_of_range(name: str, value: float | None, low: float, high: float, open_low: bool = False) -> None:
        if value is None:
            return
        ok = (low < value if open_low else low <= value) and value <= high
        if not ok:
            interval = f"({low:g}, {high:g}]" if open_low else f"[{low:g}, {high:g}]"
            raise request_error(f"Invalid {name} value, the valid range of {name} is {interval}")

    out_of_range("temperature", temperature, 0, 2)
    out_of_range("top_p", top_p, 0, 1, open_low=True)
    out_of_range("presence_penalty", presence, -2, 2)
    out_of_range("frequency_penalty", frequency, -2, 2)
    if max_tokens is not None and not 1 <= max_tokens <= MAX_TOKENS_BOUND:
        raise request_error(
            f"Invalid max_tokens value, the valid range of max_tokens is [1, {MAX_TOKENS_BOUND}]"
        )
    if n is not None and n != 1:
        raise request_error("Invalid n value (currently only n = 1 is supported)")
    if len(stops) > 16:
        raise request_error(f"Stop string array too long: {len(stops)}")
    if top_logprobs is not None:
        if not logprobs:
            raise request_error(
                "Invalid top_logprobs and logprobs value, logprobs must be set to true if"
                " top_logprobs is used."
            )
        if top_logprobs > 20:
            raise request_error("Invalid top_logprobs value, the valid range of top_logprobs is [0, 20].")
    if seed is not None and seed >= 2**63:
        raise request_error("Invalid seed value, the valid range of seed is [0, 2^63)")
    if stream_options is not None and not stream:
        raise request_error("stream_options should be set along with stream = true")


# --- the semantic pass --------------------------------------------------------------------


def _convert_parts(content: list[dict[str, Any]] | str, path: str, images_allowed: bool) -> list[Part]:
    if isinstance(content, str):
        return [content]
    parts: list[Part] = []
    for i, part in enumerate(content):
        where = f".{path}"
        if part["type"] == "text":
            parts.append(part["text"])
        elif part["type"] == "file":
            raise request_error(f"{where}: file must have a file_id or file_data")
        else:
            if not images_allowed:
                raise request_error("Image in assistant message is not supported")
            image = part["image_url"]
            problem = image_url_problem(image["url"])
            if problem is not None:
                raise request_error(f"{where}: {problem}")
            source = image_source(image["url"], image.get("detail") or "high", f"{path}.content[{i}]")
            parts.append(ImagePart(source))
    return parts


def _is_empty_system(parts: list[Part]) -> bool:
    """A system message whose joined content is exactly "" is dropped (§2.1)."""
    return not parts or (len(parts) == 1 and parts[0] == "")


@dataclass
class MessageConverter:
    """The semantic pass over the messages, one typed message at a time (a copy resumes).

    `pending`: call ids of the last assistant turn still waiting for their tool message;
    `has_calls` / `mentions_json` / `ends_in_prefix` / `prefix_followed`: what the checks after
    the last message (`finish`, `check_settings`) need to know about the messages so far. As the
    official renderer does, a continued (prefix) turn is refused only after every message is
    converted, and only when a message that is not dropped follows it (§2.11, §3).
    """

    pending: frozenset[str] = frozenset()
    has_calls: bool = False
    mentions_json: bool = False
    ends_in_prefix: bool = False
    prefix_followed: bool = False

    def add(self, message: dict[str, Any], index: int) -> Message | None:
        """The converted `messages[index]` (None: an empty system message, dropped)."""
        role, path = message["role"], message["path"]
        if role != "tool" and self.pending:
            raise _insufficient_results()
        converted: Message | None
        if role == "system":
            parts = _convert_parts(message["content"], path, images_allowed=True)
            converted = None if _is_empty_system(parts) else SystemMessage(tuple(parts))
        elif role == "user":
            converted = UserMessage(tuple(_convert_parts(message["content"], path, True)))
        elif role == "latest_reminder":
            converted = LatestReminderMessage(message["content"])
        elif role == "tool":
            converted = self._tool_result(message)
        else:
            converted = self._assistant(message, index)
        if converted is not None:
            self.prefix_followed = self.prefix_followed or self.ends_in_prefix
            self.ends_in_prefix = isinstance(converted, AssistantMessage) and converted.prefix
            self.mentions_json = self.mentions_json or _mentions_json(converted)
        return converted

    def finish(self) -> None:
        """The checks after the last message: every call has its result, and a continued turn
        is the last message."""
        if self.pending:
            raise _insufficient_results()
        if self.prefix_followed:
            raise _prefix_position()

    def check_settings(self, settings: RequestSettings) -> None:
        """The checks of the messages against the request's settings."""
        if self.ends_in_prefix:
            if settings.declares_tools or self.has_calls:
                raise request_error("Function call should not be used with prefix")
            if settings.response_format == "json_object":
                raise request_error("response_format json_object should not be used with prefix")
        if settings.response_format == "json_object" and not self.mentions_json:
            raise request_error(
                "Prompt must contain the word 'json' in some form to use 'response_format' of type"
                " 'json_object'."
            )

    def _tool_result(self, message: dict[str, Any]) -> ToolMessage:
        call_id = message["tool_call_id"]
        if not self.pending:
            raise request_error(
                "Messages with role 'tool' must be a response to a preceding message with 'tool_calls'"
            )
        if call_id not in self.pending:
            raise request_error(
                "An assistant message with 'tool_calls' must be followed by tool messages"
                " responding to each 'tool_call_id', The following tool_call_ids did not have"
                f" response messages: {call_id}"
            )
        self.pending = self.pending - {call_id}
        parts = _convert_parts(message["content"], message["path"], images_allowed=True)
        return ToolMessage(tuple(parts), tool_call_id=call_id)

    def _assistant(self, message: dict[str, Any], index: int) -> AssistantMessage:
        content = message["content"]
        calls = message["tool_calls"]
        if content is None and not calls:
            if calls is not None:
                raise _empty_calls(index)
            raise request_error("Invalid assistant message: content or tool_calls must be set")
        if calls is not None and not calls:
            raise _empty_calls(index)
        parts = [] if content is None else _convert_parts(content, message["path"], images_allowed=False)
        ids = [call.id for call in calls or ()]
        for call_id in ids:
            if ids.count(call_id) > 1:
                raise request_error(f"Duplicate value for 'tool_call_id' of {call_id} in message[{index}]")
        self.pending = frozenset(ids)
        self.has_calls = self.has_calls or bool(ids)
        return AssistantMessage(
            content="\n\n".join(parts),  # type: ignore[arg-type]
            reasoning_content=message["reasoning_content"],
            tool_calls=tuple(calls or ()),
            prefix=message["prefix"],
        )


def _insufficient_results() -> EncodingError:
    return request_error(
        "An assistant message with 'tool_calls' must be followed by tool messages responding to"
        " each 'tool_call_id'. (insufficient tool messages following tool_calls message)"
    )


def _empty_calls(index: int) -> EncodingError:
    return request_error(
        f"Invalid 'messages[{index}].tool_calls': empty array. Expected an array with minimum"
        " length 1, but got an empty array instead."
    )


def _prefix_position() -> EncodingError:
    return request_error(
        "Invalid completion message: prefix set true with message which is not final message or"
        " message role is not assistant"
    )


def _convert_tools(
    tools: list[dict[str, Any]], choice: str | tuple[str, str], thinking: bool, has_response_format: bool
) -> tuple[list[ToolDefinition], str]:
    for tool in tools:
        name, where = tool["name"], f"tools[{tool['index']}].function.name"
        if not name:
            raise request_error(
                f"Invalid '{where}': empty string. Expected a string with minimum length 1, but"
                " got an empty string instead."
            )
        if len(name) > 128:
            raise request_error(
                f"Invalid '{where}': string too long. Expected a string with maximum length 128,"
                f" but got a string with length {len(name)} instead."
            )
        if not TOOL_NAME.fullmatch(name):
            raise request_error(
                f"Invalid '{where}': string does not match pattern. Expected a string that"
                " matches the pattern '^[a-zA-Z0-9_-]+$'."
            )
    if choice == "none":
        return [], "auto"
    names = [tool["name"] for tool in tools]
    if len(set(names)) != len(names):
        raise request_error("Tool names must be unique.")
    tools = [_checked_parameters(tool) for tool in tools]
    tool_choice = choice
    if isinstance(choice, tuple):
        wanted = choice[1]
        if tools and wanted not in names:
            raise request_error(
                f"Invalid value for 'tool_call': no function named '{wanted}' was specified in the"
                " 'tools' parameter."
            )
        tools = [tool for tool in tools if tool["name"] == wanted]
        tool_choice = "required"
    if not tools:
        return [], "auto"
    if any(tool["strict"] for tool in tools):
        if not all(tool["strict"] for tool in tools):
            raise request_error("Cannot use strict tool with non-strict tool in the same request")
        if has_response_format:
            raise request_error("response_format should not be used with tools (strict tools are declared)")
    if tool_choice == "required" and thinking:
        raise request_error("Thinking mode does not support this tool_choice")
    definitions = [ToolDefinition(t["name"], t["description"], t["parameters"]) for t in tools]
    return definitions, tool_choice  # type: ignore[return-value]


def _checked_parameters(tool: dict[str, Any]) -> dict[str, Any]:
    """A strict tool's schema is rewritten (§2.6); any other is validated as JSON Schema."""
    if tool["strict"]:
        try:
            return tool | {"parameters": strict_parameters(tool["parameters"])}
        except StrictSchemaError as error:
            raise request_error(f"Invalid strict schema for function '{tool['name']}': {error}") from None
    if tool["parameters"] is not None:
        problem = schema_problem(tool["parameters"], require_object=True)
        if problem is not None:
            raise request_error(f"Invalid schema for function '{tool['name']}': {problem}")
    return tool


def _check_response_schema(schema: Any, strict: bool) -> None:
    """A strict response schema is checked by the strict rules instead of JSON Schema (§2.10)."""
    if strict:
        try:
            strict_response_schema(schema)
        except StrictSchemaError as error:
            raise request_error(f"Invalid strict json schema: {error}") from None
        return
    problem = schema_problem(schema, require_object=False)
    if problem is not None:
        raise request_error(f"Invalid json schema: {problem}")


def _mentions_json(message: Message) -> bool:
    if isinstance(message, (AssistantMessage, LatestReminderMessage)):
        texts = [message.content]
    else:
        texts = [part for part in message.parts if isinstance(part, str)]
    return any(JSON_WORD.search(text) for text in texts)
