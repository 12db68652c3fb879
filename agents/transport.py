"""Sending a chat-completions request body through the openai client, without its params transform.

`client.chat.completions.create(**body)` first walks the whole request against the SDK's
TypedDict annotations (`maybe_transform`): for plain JSON data like ours it changes nothing, but
it costs O(transcript) with a large constant (about 0.25 ms per message on our machine, ~100 ms
per request at 200 tool steps), and was most of the runner's per-step time. The runner builds
the body itself, so it posts it with `client.post` (the SDK's documented way to send a request
body as is), keeping everything else the client does: base URL, auth headers, timeouts, SSE
decoding and the typed response. Only JSON key order on the wire differs from `create`.
"""

from __future__ import annotations

import inspect
from functools import cache
from typing import Any

from openai import AsyncOpenAI, AsyncStream
from openai.resources.chat.completions import AsyncCompletions
from openai.types.chat import ChatCompletion, ChatCompletionChunk

from .errors import AgentConfigError

# `create` keyword arguments that are request options, not body fields.
_OPTIONS = {"extra_headers": "headers", "extra_query": "params", "extra_body": "extra_json"}


@cache
def create_parameters() -> frozenset[str]:
    """The keyword arguments `chat.completions.create` accepts (so unknown settings still fail)."""
    return frozenset(inspect.signature(AsyncCompletions.create).parameters) - {"self", "timeout"}


def split_request(body: dict[str, Any], timeout: float | None) -> tuple[dict[str, Any], dict[str, Any]]:
    """`create`-style keyword arguments -> (JSON body, request options)."""
    unknown = sorted(body.keys() - create_parameters())
    if unknown:
        raise AgentConfigError(
            f"model_settings: {', '.join(map(repr, unknown))} is not a chat.completions.create "
            "argument (put server-specific fields in model_settings['extra_body'])"
        )
    json_body = {k: v for k, v in body.items() if k not in _OPTIONS}
    options: dict[str, Any] = {_OPTIONS[k]: v for k, v in body.items() if k in _OPTIONS and v is not None}
    if timeout is not None:
        options["timeout"] = timeout
    return json_body, options


async def post_completion(client: AsyncOpenAI, body: dict[str, Any], timeout: float | None) -> ChatCompletion:
    json_body, options = split_request(body, timeout)
    return await client.post("/chat/completions", cast_to=ChatCompletion, body=json_body, options=options)


async def post_streamed(
    client: AsyncOpenAI, body: dict[str, Any], timeout: float | None
) -> AsyncStream[ChatCompletionChunk]:
    json_body, options = split_request(body, timeout)
    json_body = {**json_body, "stream": True, "stream_options": {"include_usage": True}}
    return await client.post(
        "/chat/completions",
        cast_to=ChatCompletion,
        body=json_body,
        options=options,
        stream=True,
        stream_cls=AsyncStream[ChatCompletionChunk],
    )
