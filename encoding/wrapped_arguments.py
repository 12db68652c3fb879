"""Arguments a model wrapped in a spurious `{"arguments": ...}` (or `{"input": ...}`): a
tolerant parse's last repair (ENCODING.md §4.5), which needs the tools' declared parameters.

`<｜DSML｜ parameter name="arguments" string="false">{"city": "Paris"}</｜DSML｜ parameter>`
gives `{"arguments": {"city": "Paris"}}`. When the tool declares parameters, `arguments` is not
one of them, it is the call's only key, and its value is an object (or a string holding one)
whose keys the tool declares, the inner object is the call's arguments, as written. When the
tool declares parameters and the wrapper's value does not fit them, the call is ambiguous and
gets a problem. A tool with no declared parameters takes any key, so nothing is changed there.
"""

from __future__ import annotations

import json
from collections.abc import Collection, Mapping
from dataclasses import replace

from .parsed import ParsedToolCall

WRAPPERS = ("arguments", "input")


def repair(wrapper: str) -> str:
    return f'arguments wrapped in {{"{wrapper}": ...}}: unwrapped'


def problem(wrapper: str) -> str:
    return f'arguments wrapped in {{"{wrapper}": ...}} that do not fit the tool\'s parameters'


def declared_parameters(tools: object) -> dict[str, frozenset[str]]:
    """Tool name -> declared parameter names, for OpenAI `tools` entries (dicts or models with
    `model_dump`, Chat Completions' or the Responses API's shape) that declare `properties`."""
    found: dict[str, frozenset[str]] = {}
    for tool in tools or ():
        entry = tool.model_dump() if hasattr(tool, "model_dump") else tool
        # Chat Completions nests the function; the Responses API writes it flat.
        function = (entry.get("function") or entry) if isinstance(entry, Mapping) else None
        if not isinstance(function, Mapping) or not isinstance(function.get("name"), str):
            continue
        parameters = function.get("parameters")
        properties = parameters.get("properties") if isinstance(parameters, Mapping) else None
        if isinstance(properties, Mapping) and properties:
            found[function["name"]] = frozenset(properties)
    return found


def unwrap(call: ParsedToolCall, declared: Mapping[str, Collection[str]]) -> ParsedToolCall:
    """`call` with wrapped arguments unwrapped (and the repair named), flagged when the wrapper
    does not fit; unchanged otherwise."""
    allowed = declared.get(call.name)
    if not allowed or not call.valid:
        return call
    try:
        arguments = json.loads(call.arguments)
    except (ValueError, RecursionError):
        return call
    if not isinstance(arguments, dict) or len(arguments) != 1:
        return call
    ((wrapper, inner),) = arguments.items()
    if wrapper not in WRAPPERS or wrapper in allowed:
        return call
    text = inner if isinstance(inner, str) else _raw_value(call.arguments, wrapper)
    try:
        value = json.loads(text) if text is not None else None
    except (ValueError, RecursionError):  # the inner text is model output too
        value = None
    if not isinstance(value, dict) or not set(value) <= set(allowed):
        return replace(call, problems=(*call.problems, problem(wrapper)))
    return replace(call, arguments=text.strip(), repairs=(*call.repairs, repair(wrapper)))


def _raw_value(arguments: str, key: str) -> str | None:
    """The value of the one `key` in `arguments` as written (the parser writes `{"key": VALUE}`)."""
    head = "{" + json.dumps(key) + ": "
    return arguments[len(head) : -1] if arguments.startswith(head) and arguments.endswith("}") else None
