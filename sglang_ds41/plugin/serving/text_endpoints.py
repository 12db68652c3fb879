"""SGLang's text-parsing endpoints read V4.1 output with our parser (docs/ENCODING.md §4.4).

`POST /separate_reasoning` and `POST /parse_function_call` hand a completion's *text* to the
served adapter (`DeepSeekRecipeChatEncodingAdapter.separate_reasoning_text` /
`parse_function_call_text`), which encodes it with the checkpoint's tokenizer, so the special
spellings in it count as the tokens the model would have sampled, and parses the ids. Two AROUND
hooks do the same with our token-level parser, so these endpoints agree with chat:

* `/separate_reasoning`: reasoning up to `</think>` when the text opens with `<think>` or closes
  a thinking block (upstream's rule), else all content.
* `/parse_function_call`: the calls of the DSML block, string arguments byte for byte. A call
  our parser finds malformed (arguments that are not a JSON object, unexpected attributes or
  text in its tags, an invoke or block that never closed) is returned with an `error` field
  naming its problems, next to the endpoint's `tool_index`, `name` and `parameters`, so it is
  never taken for an ordinary call; valid calls have no such field. A call to a tool outside
  `tools` has `tool_index` -1, as upstream.

Other chat encodings keep upstream's code.
"""

from __future__ import annotations

from functools import cache
from typing import Any

from sglang_ds41.encoding import wrapped_arguments
from sglang_ds41.encoding.conversation import ParsingOptions
from sglang_ds41.encoding.special_tokens import Special
from sglang_ds41.plugin.serving.parsers import ADAPTER, v41_adapter
from sglang_ds41.plugin.serving.served_output import ServedOutput, Step


def _parse(adapter: Any, ids: list[int], options: ParsingOptions, declared=None) -> Step:
    """The ids as one finished choice, read as chat reads it (`ServedOutput`)."""
    tokenizer = adapter.deepseek_recipe.hf_tokenizer
    return ServedOutput(options, tokenizer=tokenizer, declared=declared).finish(ids, "stop")


def _ids(adapter: Any, text: str) -> list[int]:
    return adapter.deepseek_recipe.hf_tokenizer.encode(text, add_special_tokens=False).ids


@cache
def _flagged_item() -> type:
    """SGLang's `ToolCallItem` with the `error` of a malformed call."""
    from sglang.srt.function_call.core_types import ToolCallItem

    class FlaggedToolCallItem(ToolCallItem):
        error: str

    return FlaggedToolCallItem


def separate_reasoning_text(original, self, text: str):
    """AROUND `separate_reasoning_text`: (reasoning, content) of a completion's text."""
    if not v41_adapter(self):
        return original(self, text)
    ids = _ids(self, text)
    opened = ids[:1] == [Special.THINK_START.id]
    if opened:
        ids = ids[1:]
    step = _parse(self, ids, ParsingOptions(thinking=opened or Special.THINK_END.id in ids, tolerant=True))
    return step.reasoning, step.content


def parse_function_call_text(original, self, text: str, tools: list):
    """AROUND `parse_function_call_text`: (content, calls) of a completion's text."""
    if not v41_adapter(self) or not tools:
        return original(self, text, tools)
    from sglang.srt.function_call.core_types import ToolCallItem

    options = ParsingOptions(thinking=False, parse_tool_calls=True, tolerant=True)
    step = _parse(self, _ids(self, text), options, wrapped_arguments.declared_parameters(tools))
    indices = {tool.function.name: i for i, tool in enumerate(tools)}
    calls = []
    for call in sorted([*step.calls, *step.invalid_calls], key=lambda c: c.position):
        fields = {"tool_index": indices.get(call.name, -1), "name": call.name, "parameters": call.arguments}
        calls.append(ToolCallItem(**fields) if call.valid else _flagged_item()(**fields, error=call.error))
    return step.content, calls


HOOKS = {
    f"{ADAPTER}.separate_reasoning_text": separate_reasoning_text,
    f"{ADAPTER}.parse_function_call_text": parse_function_call_text,
}
