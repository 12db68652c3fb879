"""Requests go out as the SDK's `chat.completions.create` would send them, minus its slow transform."""

from __future__ import annotations

import asyncio

import openai
import pytest
from sglang_ds41.agents import Agent, AgentConfigError, Runner, function_tool
from sglang_ds41.agents.testing import Reply, by_turn
from sglang_ds41.agents.transport import split_request

from .conftest import fast_policies


@function_tool
def lookup(key: str, limit: int = 3) -> str:
    """Look a key up."""
    return f"{key}:{limit}"


REPLIES = [
    Reply(reasoning_content="r", tool_calls=[("lookup", {"key": "a", "limit": None})]),
    Reply(reasoning_content="done", content="ok"),
]


def make_agent(**kwargs) -> Agent:
    return Agent(
        name="t",
        instructions="be brief",
        tools=[lookup],
        reasoning_effort="max",
        model_settings={"temperature": 0.3, "max_tokens": 50, "extra_body": {"top_k": 5}},
        policies=fast_policies(),
        **kwargs,
    )


@pytest.mark.parametrize("stream", [False, True])
def test_request_bodies_equal_what_the_sdk_create_sends(serve, stream):
    agent = make_agent()
    server = serve(by_turn(REPLIES), validate=False)
    if stream:

        async def go():
            s = Runner.run_streamed(agent, "hi", base_url=server.base_url)
            async for _ in s:
                pass
            return s.result

        result = asyncio.run(go())
    else:
        result = Runner.run_sync(agent, "hi", base_url=server.base_url)

    # The oracle: the same conversation sent through the SDK's own create().
    oracle = serve(by_turn(REPLIES), validate=False)
    client = openai.OpenAI(base_url=oracle.base_url, api_key="x", max_retries=0)
    extra = {"top_k": 5, "thinking": {"type": "enabled"}, "chat_template_kwargs": {"thinking": True}}
    stream_args = {"stream": True, "stream_options": {"include_usage": True}} if stream else {}
    for upto in (2, 4):  # the transcript before each request: system + user (+ call + result)
        response = client.chat.completions.create(
            model="DeepSeek-V4.1-Flash",
            messages=result.messages[:upto],
            tools=[lookup.to_openai()],
            temperature=0.3,
            max_tokens=50,
            reasoning_effort="max",
            extra_body=extra,
            **stream_args,
        )
        if stream:
            list(response)
    assert server.bodies[0] == oracle.bodies[0]
    assert server.bodies[1] == oracle.bodies[1]


def test_an_unknown_model_setting_is_refused_before_anything_is_sent(serve):
    server = serve(by_turn(REPLIES))
    agent = Agent(name="t", tools=[lookup], model_settings={"top_k": 5}, policies=fast_policies())
    with pytest.raises(AgentConfigError, match=r"'top_k' is not a chat.completions.create argument"):
        Runner.run_sync(agent, "hi", base_url=server.base_url)
    assert server.requests == []


def test_request_options_are_split_from_the_body():
    body = {"model": "m", "messages": [], "extra_body": {"k": 1}, "extra_headers": {"X-A": "1"}}
    json_body, options = split_request(body, 2.5)
    assert json_body == {"model": "m", "messages": []}
    assert options == {"extra_json": {"k": 1}, "headers": {"X-A": "1"}, "timeout": 2.5}
