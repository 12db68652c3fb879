"""Our token-aware V4.1 parser serves SGLang's Responses API too (docs/ENCODING.md §4.4).

SGLang 0.5.23 parses a `dsv41` server's `/v1/responses` output in the deepseek-recipe adapter:
`parse_responses_output` for a whole response, `new_responses_stream(...).step(chunk, finish)`
per streamed engine chunk. Both returned every call recipe's parser saw, so a call with
arguments that are not JSON, or one cut off by `max_output_tokens`, came back as an ordinary
`function_call` item. AROUND hooks hand the ids to `served_output.ServedOutput` instead (the
same parse as chat completions) for the V4.1 spec only.

The Responses API already has the place for a call that is not whole: a `function_call` item's
`status` is `"incomplete"`, which SGLang sets for calls its text parsers saw cut off. Our
malformed calls (invalid JSON, unexpected attributes, truncated, an unclosed block) come as
`function_call` items with `status: "incomplete"` and their arguments as written; valid calls
are `"completed"`. Two small hooks carry the flag to where SGLang builds the items:
`OpenAIServingResponses._output_items` (one-shot) and `_incomplete_tool_call_indices` as the
Responses stream reads it (streamed; it asks with no parser for the token path).
"""

from __future__ import annotations

import contextvars
import inspect
from typing import Any

from sglang.srt.function_call.core_types import ToolCallItem

from sglang_ds41.encoding import wrapped_arguments
from sglang_ds41.encoding.conversation import ParsingOptions
from sglang_ds41.plugin.serving.parsers import ADAPTER, next_step, ours, stop_strings
from sglang_ds41.plugin.serving.served_output import ServedCall, ServedOutput, Step

RESPONSES = "sglang.srt.entrypoints.openai.serving_responses"
SERVING = f"{RESPONSES}.OpenAIServingResponses"

# Positions of the calls our parser flagged, for the items SGLang builds next in this context.
_FLAGGED: contextvars.ContextVar[set[int] | None] = contextvars.ContextVar(
    "sglang_ds41_incomplete_calls", default=None
)


def _output(adapter: Any, kwargs: dict[str, Any]) -> ServedOutput:
    """The parse recipe's `_new_responses_parser` would make from the hooked method's keyword
    arguments: where the output starts (the reasoning decision), calls on or off, reasoning
    apart or not, the request's stop strings."""
    options = ParsingOptions(
        thinking=bool(kwargs["require_reasoning"]),
        parse_tool_calls=bool(kwargs["parse_tool_calls"]),
        tolerant=True,
    )
    return ServedOutput(
        options,
        tokenizer=adapter.deepseek_recipe.hf_tokenizer,
        separate_reasoning=kwargs["separate_reasoning"],
        stops=stop_strings(kwargs["request"].stop),
        declared=wrapped_arguments.declared_parameters(kwargs["request"].tools),
    )


def _items(step: Step) -> tuple[list[Any], set[int]]:
    """ToolCallItems in output order (tool_index = the call's position) and the flagged ones."""
    calls: list[ServedCall] = sorted([*step.calls, *step.invalid_calls], key=lambda c: c.position)
    items = [ToolCallItem(tool_index=c.position, name=c.name, parameters=c.arguments) for c in calls]
    return items, {c.position for c in step.invalid_calls}


def parse_responses_output(original, self, **kwargs):
    """AROUND `DeepSeekRecipeChatEncodingAdapter.parse_responses_output`: a whole response."""
    if not ours(self):
        return original(self, **kwargs)
    finish = kwargs.get("finish_reason") or {"type": "stop"}
    step = _output(self, kwargs).finish(kwargs["output_ids"], finish["type"], finish.get("matched"))
    items, flagged = _items(step)
    _FLAGGED.set(flagged or None)
    return step.reasoning, step.content, items


def output_items(original, self, *args, **kwargs):
    """AROUND `OpenAIServingResponses._output_items`: the calls our parse flagged become
    `incomplete` items."""
    flagged = _FLAGGED.get()
    if not flagged:
        return original(self, *args, **kwargs)
    _FLAGGED.set(None)
    bound = inspect.signature(original).bind(self, *args, **kwargs)
    bound.arguments["incomplete_calls"] = set(bound.arguments["incomplete_calls"]) | flagged
    return original(*bound.args, **bound.kwargs)


class ResponsesStream:
    """`new_responses_stream`'s object: `step(chunk, finish_reason)` -> (reasoning, content,
    calls), each call once and whole (as chat streams them), flagged ones remembered."""

    def __init__(self, output: ServedOutput) -> None:
        self._output = output
        self.flagged: set[int] = set()

    def step(self, chunk: dict[str, Any], finish_reason: dict[str, Any] | None) -> tuple[str, str, list[Any]]:
        step = next_step(self._output, chunk, finish_reason)
        items, flagged = _items(step)
        if flagged:
            self.flagged |= flagged
            _FLAGGED.set(set(self.flagged))
        return step.reasoning, step.content, items


def new_responses_stream(original, self, **kwargs):
    """AROUND `DeepSeekRecipeChatEncodingAdapter.new_responses_stream`."""
    if not ours(self):
        return original(self, **kwargs)
    return ResponsesStream(_output(self, kwargs))


def incomplete_tool_call_indices(original, parser):
    """AROUND `_incomplete_tool_call_indices` as `serving_responses` calls it: with no parser
    (the token path) the calls our stream flagged."""
    found = original(parser)
    if parser is None and (flagged := _FLAGGED.get()):
        return set(found) | flagged
    return found


HOOKS = {
    f"{ADAPTER}.parse_responses_output": parse_responses_output,
    f"{ADAPTER}.new_responses_stream": new_responses_stream,
    f"{SERVING}._output_items": output_items,
    f"{RESPONSES}._incomplete_tool_call_indices": incomplete_tool_call_indices,
}
