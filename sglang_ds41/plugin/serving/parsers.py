"""Our token-aware V4.1 parser serves SGLang's chat completions (docs/ENCODING.md §4.4).

SGLang 0.5.23 parses a `dsv41` server's chat output (when `--reasoning-parser deepseek-v41` or
`--tool-call-parser deepseekv41` is set, as `sglang-ds41 serve` does) in its deepseek-recipe
adapter, `DeepSeekRecipeChatEncodingAdapter`: `parse_chat_response` for a whole choice,
`stream_chat_chunks` per streamed engine chunk, both fed the engine's output token ids. Two
AROUND hooks on those methods hand the ids to our parser instead (`served_output.ServedOutput`,
`encoding.StreamParser` in token mode) for the V4.1 spec only; every other spec, and a V4.1
server that configured other parsers, keeps upstream's code. A third AROUND hook, on
`OpenAIServingChat._build_chat_response`, adds the extension field to the response.

The extension: malformed calls are never ordinary `tool_calls`. They come as

    message.invalid_tool_calls = [
        {"index": 0, "id": "call_...", "type": "function",
         "function": {"name": "get_weather", "arguments": "<the arguments text as written>"},
         "error": "<what is wrong; several problems joined by '; '>"}
    ]

(LangChain's message type has the same field): in the message of a non-streamed choice and in
the `delta` of a streamed chunk. The field is absent when there is none. A call is invalid when
its arguments are not a JSON object (e.g. broken `string="false"` text), its tags carry
attributes or text the format does not have, the output ended inside it (`max_tokens`: "call
truncated at max_tokens"), or its calls block never closed. `finish_reason` is `tool_calls`
exactly when `tool_calls` holds a call (`stop` for a turn whose only calls are malformed;
`length` when it was cut off). The DSML of any call stays out of `content`.

The parse is tolerant (docs/ENCODING.md §4.5): call spellings besides V4.1's whose meaning is
clear are calls, each with a `repairs` list naming what was read past, added to its entry in
`tool_calls` (one-shot: the message; streamed: the chunk that carries the call) and in
`invalid_tool_calls`.

Everything else is SGLang's: the request handling, where parsing starts (thinking, prefix
continuation, quick-instruction tasks), the call ids, the SSE framing (`token_output_sse_chunks`)
and the finish chunk.
"""

from __future__ import annotations

import contextvars
import json
from typing import Any

from sglang.srt.entrypoints.openai import serving_deepseek_recipe as upstream
from sglang.srt.entrypoints.openai.chat_encoding_adapters import (
    select_new_output_ids,
    token_output_sse_chunks,
)
from sglang.srt.entrypoints.openai.protocol import (
    ChatCompletionResponse,
    ChatCompletionResponseStreamChoice,
    ChatCompletionStreamResponse,
    DeltaMessage,
    FunctionResponse,
    ToolCall,
)
from sglang.srt.parser.deepseek_recipe_renderer import load_deepseek_recipe
from sglang.srt.runtime_context import get_serving
from starlette.responses import Response

from sglang_ds41.encoding import wrapped_arguments
from sglang_ds41.encoding.conversation import ParsingOptions
from sglang_ds41.plugin.serving.served_output import (
    ServedCall,
    ServedOutput,
    Step,
    reads_json_output,
    served_finish_reason,
)

MODULE = "sglang.srt.entrypoints.openai.serving_deepseek_recipe"
ADAPTER = f"{MODULE}.DeepSeekRecipeChatEncodingAdapter"
CHAT = "sglang.srt.entrypoints.openai.serving_chat.OpenAIServingChat"
SPEC = "dsv41"
FIELD = "invalid_tool_calls"
REPAIRS = "repairs"  # per call: what a tolerant parse read past (docs/ENCODING.md §4.5)

# The invalid calls and the repairs (by call index) of each choice `parse_chat_response` parsed
# inside one `_build_chat_response`.
Collected = list[tuple[list[dict], dict[int, list[str]]]]
_COLLECTED: contextvars.ContextVar[Collected | None] = contextvars.ContextVar(
    "sglang_ds41_invalid_tool_calls", default=None
)


def v41_adapter(adapter: Any) -> bool:
    """The adapter renders and parses the V4.1 chat encoding."""
    return getattr(adapter, "_spec", None) == SPEC


def ours(adapter: Any) -> bool:
    """The adapter serves V4.1 and parses its output (a V4.1 parser is configured)."""
    return v41_adapter(adapter) and bool(getattr(adapter, "_token_output", False))


# ---- the request's parsing options, as upstream decides them ---------------------------------


def _initial_stage(adapter: Any, request: Any) -> Any:
    """Where the output starts (recipe's ThinkingInitialStage or None), from upstream's own
    decision for this request (thinking, the continued final message, a task)."""
    continued = None
    if request.continue_final_message:
        last = [m.model_dump(exclude_unset=True, by_alias=True, mode="json") for m in request.messages[-1:]]
        continued = upstream._trailing_assistant_turn(upstream._null_content_as_empty(last))
    return adapter.deepseek_recipe.parse_start(
        thinking=adapter._hooks.thinking_requested(request), task=request.task, continued=continued
    )


def parsing_options(adapter: Any, request: Any) -> ParsingOptions:
    stage = _initial_stage(adapter, request)
    stages = load_deepseek_recipe().ThinkingInitialStage
    response_format = request.response_format
    return ParsingOptions(
        thinking=stage is not None,
        reasoning_started=stage is not None and stage == stages.ReasoningContinuation,
        in_content=stage is not None and stage == stages.ContentContinuation,
        parse_tool_calls=request.task is None and adapter._hooks.tool_call_parsing_active(request),
        # SGLang enforces required/named choices with its grammar; the prompt opens no block.
        starts_in_tool_calls=False,
        parse_json_output=reads_json_output(None if response_format is None else response_format.type),
        tolerant=True,
    )


def stop_strings(stop: str | list[str] | None) -> list[str]:
    """A request's `stop` as the list `ServedOutput` takes."""
    return [stop] if isinstance(stop, str) else list(stop or [])


def new_output(adapter: Any, request: Any) -> ServedOutput:
    return ServedOutput(
        parsing_options(adapter, request),
        tokenizer=adapter.deepseek_recipe.hf_tokenizer,
        separate_reasoning=adapter._separate_reasoning and request.separate_reasoning,
        stream_reasoning=request.stream_reasoning,
        stops=stop_strings(request.stop),
        declared=wrapped_arguments.declared_parameters(request.tools),
    )


def next_step(
    output: ServedOutput,
    chunk: dict[str, Any],
    finish_reason: dict[str, Any] | None,
    *,
    keep_matched_stop: bool = False,
) -> Step:
    """Feed one streamed engine chunk (its ids not yet consumed, as SGLang selects them) to the
    parse; with `finish_reason` the choice ends there."""
    finish_type = finish_reason["type"] if finish_reason else None
    new_ids = select_new_output_ids(
        output_ids=chunk.get("output_ids") or [],
        num_consumed_tokens=output.num_consumed_tokens,
        completion_tokens=chunk["meta_info"]["completion_tokens"],
        finish_reason_type=finish_type,
        incremental=get_serving().incremental_streaming_output,
    )
    if finish_type is None:
        return output.feed(new_ids)
    matched = finish_reason.get("matched")
    return output.finish(new_ids, finish_type, matched, keep_matched_stop=keep_matched_stop)


# ---- OpenAI shapes ---------------------------------------------------------------------------


def _tool_calls(adapter: Any, calls: list[ServedCall], first_index: int, history: int) -> list[Any]:
    """`calls` as SGLang's `ToolCall`s; `history` is the request's count of earlier calls
    (upstream's id scheme takes it)."""
    return [
        ToolCall(
            id=adapter._tool_call_id(index, call.name, history),
            index=index,
            function=FunctionResponse(name=call.name, arguments=call.arguments),
        )
        for index, call in enumerate(calls, first_index)
    ]


def _invalid_entries(adapter: Any, calls: list[ServedCall], first_index: int, history: int) -> list[dict]:
    return [
        {
            "index": index,
            "id": adapter._tool_call_id(index, call.name, history),
            "type": "function",
            "function": {"name": call.name, "arguments": call.arguments},
            "error": call.error,
        }
        | ({REPAIRS: list(call.repairs)} if call.repairs else {})
        for index, call in enumerate(calls, first_index)
    ]


def _repairs(calls: list[ServedCall], first_index: int) -> dict[int, list[str]]:
    """The repairs of `calls` by their `tool_calls` index (only calls that have any)."""
    return {index: list(call.repairs) for index, call in enumerate(calls, first_index) if call.repairs}


def _history(adapter: Any, request: Any, step: Step) -> int:
    """Earlier calls in the request's messages, counted only when `step` hands out calls (the
    count walks the whole history)."""
    return adapter._hooks.history_tool_calls_count(request) if step.calls or step.invalid_calls else 0


# ---- hooks -----------------------------------------------------------------------------------


def parse_chat_response(original, self, **kwargs):
    """AROUND `DeepSeekRecipeChatEncodingAdapter.parse_chat_response`: one whole choice."""
    if not ours(self):
        return original(self, **kwargs)
    request, finish_reason = kwargs["request"], kwargs["finish_reason"]
    step = new_output(self, request).finish(
        kwargs["output_ids"],
        finish_reason["type"],
        finish_reason.get("matched"),
        keep_matched_stop=request.no_stop_trim,
    )
    history = _history(self, request, step)
    collected = _COLLECTED.get()
    if collected is not None:
        collected.append((_invalid_entries(self, step.invalid_calls, 0, history), _repairs(step.calls, 0)))
    reason = served_finish_reason(finish_reason["type"], step)
    if reason != finish_reason["type"]:
        finish_reason = {**finish_reason, "type": reason, "matched": None}
    tool_calls = _tool_calls(self, step.calls, 0, history) or None
    return step.reasoning or None, step.content, tool_calls, finish_reason


class _StreamState:
    """parser_dict's entry for one streamed choice: the parse and how many calls went out."""

    def __init__(self, output: ServedOutput) -> None:
        self.output = output
        self.calls_sent = 0
        self.invalid_sent = 0

    @property
    def num_consumed_tokens(self) -> int:
        return self.output.num_consumed_tokens


def stream_chat_chunks(original, self, **kwargs):
    """AROUND `DeepSeekRecipeChatEncodingAdapter.stream_chat_chunks`: one engine chunk of one
    streamed choice -> its SSE chunks (reasoning, content, whole calls, invalid calls)."""
    if not ours(self):
        return original(self, **kwargs)
    content, index, request = kwargs["content"], kwargs["index"], kwargs["request"]
    parser_dict, finish_reason_type = kwargs["parser_dict"], kwargs["finish_reason_type"]
    state = parser_dict.get(index)
    if not isinstance(state, _StreamState):
        state = parser_dict[index] = _StreamState(new_output(self, request))
    finish_reason = None
    if finish_reason_type is not None:
        reported = content["meta_info"]["finish_reason"]
        matched = reported.get("matched") if isinstance(reported, dict) else None
        finish_reason = {"type": finish_reason_type, "matched": matched}
    step = next_step(state.output, content, finish_reason, keep_matched_stop=request.no_stop_trim)
    history = _history(self, request, step)
    if step.calls:
        # upstream's finish chunk then says tool_calls, by the rule of `served_finish_reason`
        kwargs["has_tool_calls"][index] = True
    meta = content["meta_info"]
    chunks = token_output_sse_chunks(
        chunk_id=meta["id"],
        created=kwargs["created"],
        model=request.model,
        index=index,
        usage=kwargs["usage"],
        logprobs=kwargs["choice_logprobs"],
        reasoning=step.reasoning,
        content=step.content,
        tool_calls=_tool_calls(self, step.calls, state.calls_sent, history),
    )
    if any(call.repairs for call in step.calls):
        chunks = _with_repairs(chunks, _repairs(step.calls, state.calls_sent))
    state.calls_sent += len(step.calls)
    if step.invalid_calls:
        entries = _invalid_entries(self, step.invalid_calls, state.invalid_sent, history)
        chunks.append(_invalid_chunk(entries, meta["id"], kwargs["created"], request.model, index, kwargs))
        state.invalid_sent += len(step.invalid_calls)
    return chunks


def _invalid_chunk(entries: list[dict], chunk_id: str, created: int, model: str, index: int, kwargs) -> str:
    """An SSE chunk whose delta carries `invalid_tool_calls` (SGLang's DeltaMessage has no such
    field, so the chunk is built as SGLang builds one and the field added to its JSON)."""
    choice = ChatCompletionResponseStreamChoice(index=index, delta=DeltaMessage(), finish_reason=None)
    chunk = ChatCompletionStreamResponse(
        id=chunk_id, created=created, choices=[choice], model=model, usage=kwargs["usage"]
    )
    body = json.loads(chunk.model_dump_json())
    body["choices"][0]["delta"][FIELD] = entries
    return f"data: {json.dumps(body, ensure_ascii=False)}\n\n"


def _with_repairs(chunks: list[str], repairs: dict[int, list[str]]) -> list[str]:
    """SSE chunks with each repaired call's `repairs` added to its `tool_calls` entry (SGLang's
    ToolCall has no such field)."""
    out = []
    for chunk in chunks:
        body = json.loads(chunk.removeprefix("data: ")) if '"tool_calls"' in chunk else None
        entries = body["choices"][0]["delta"].get("tool_calls") if body else None
        if not entries:
            out.append(chunk)
            continue
        for entry in entries:
            if entry.get("index") in repairs:
                entry[REPAIRS] = repairs[entry["index"]]
        out.append(f"data: {json.dumps(body, ensure_ascii=False)}\n\n")
    return out


def build_chat_response(original, self, *args, **kwargs):
    """AROUND `OpenAIServingChat._build_chat_response`: the invalid calls our parser found go
    into each choice's message as `invalid_tool_calls`, the repairs of a tolerant parse into
    their calls' `repairs`."""
    token = _COLLECTED.set([])
    try:
        response = original(self, *args, **kwargs)
        collected = _COLLECTED.get()
    finally:
        _COLLECTED.reset(token)
    if not any(invalid or repairs for invalid, repairs in collected):
        return response
    if not isinstance(response, ChatCompletionResponse):
        return response  # an error response
    body = json.loads(response.model_dump_json(by_alias=True))
    for choice, (invalid, repairs) in zip(body["choices"], collected, strict=False):
        if invalid:
            choice["message"][FIELD] = invalid
        for entry in choice["message"].get("tool_calls") or []:
            if entry.get("index") in repairs:
                entry[REPAIRS] = repairs[entry["index"]]
    return Response(content=json.dumps(body, ensure_ascii=False), media_type="application/json")


HOOKS = {
    f"{ADAPTER}.parse_chat_response": parse_chat_response,
    f"{ADAPTER}.stream_chat_chunks": stream_chat_chunks,
    f"{CHAT}._build_chat_response": build_chat_response,
}
