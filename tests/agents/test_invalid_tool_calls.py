"""The runner reads the server's `invalid_tool_calls` field: nothing of it runs, a repair turn names
each problem, and a tool's malformed calls use up its retry budget.

The server is an `httpx.MockTransport` behind the real `openai` client, answering with the exact
JSON shapes sglang-ds41's plugin sends (tests/integration/test_served_tool_calls.py checks the
real server sends them), plain and streamed.
"""

from __future__ import annotations

import json

import httpx
import openai
import pytest
from sglang_ds41.agents import Agent, LimitExceeded, Runner, function_tool
from sglang_ds41.agents.log import read_log
from sglang_ds41.agents.tool_turn import MALFORMED

from .conftest import fast_policies

BROKEN = {
    "index": 0,
    "id": "call_broken",
    "type": "function",
    "function": {"name": "get_weather", "arguments": '{"city": {oops}'},
    "error": "arguments are not valid JSON (Expecting property name)",
}
CUT = {
    "index": 1,
    "id": "call_cut",
    "type": "function",
    "function": {"name": "get_weather", "arguments": '{"city": "Par'},
    "error": "call truncated at max_tokens; tool-call block not closed (output truncated at max_tokens)",
}
VALID = {
    "id": "call_ok",
    "type": "function",
    "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'},
}


def make_weather(calls: list[str], max_retries: int = 2):
    @function_tool(max_retries=max_retries)
    def get_weather(city: str) -> dict:
        """Current weather of a city.

        Args:
            city: City name.
        """
        calls.append(city)
        return {"city": city, "celsius": 4}

    return get_weather


def completion(message: dict, finish: str) -> dict:
    return {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "created": 0,
        "model": "default",
        "choices": [{"index": 0, "message": {"role": "assistant", **message}, "finish_reason": finish}],
        "usage": {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15},
    }


def sse(message: dict, finish: str) -> bytes:
    """The same turn as SSE chunks the way the plugin streams it: content, whole calls, then
    a chunk whose delta carries invalid_tool_calls, then the finish chunk."""
    base = {"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 0, "model": "default"}
    deltas = [{"role": "assistant", "content": ""}, {"content": message.get("content", "")}]
    deltas += [{"tool_calls": [{**call, "index": i}]} for i, call in enumerate(message.get("tool_calls", []))]
    if message.get("invalid_tool_calls"):
        deltas.append({"invalid_tool_calls": message["invalid_tool_calls"]})
    chunks = [{**base, "choices": [{"index": 0, "delta": d, "finish_reason": None}]} for d in deltas]
    chunks.append({**base, "choices": [{"index": 0, "delta": {}, "finish_reason": finish}]})
    return b"".join(f"data: {json.dumps(c)}\n\n".encode() for c in chunks) + b"data: [DONE]\n\n"


class Server:
    """Answers turn n with replies[n] (by the number of assistant messages sent), records bodies."""

    def __init__(self, replies: list[tuple[dict, str]]) -> None:
        self.replies, self.bodies = replies, []

    def handle(self, request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        self.bodies.append(body)
        turn = sum(1 for m in body["messages"] if m["role"] == "assistant")
        message, finish = self.replies[min(turn, len(self.replies) - 1)]
        if body.get("stream"):
            headers = {"content-type": "text/event-stream"}
            return httpx.Response(200, content=sse(message, finish), headers=headers)
        return httpx.Response(200, json=completion(message, finish))

    def client(self) -> openai.AsyncOpenAI:
        http = httpx.AsyncClient(transport=httpx.MockTransport(self.handle))
        return openai.AsyncOpenAI(base_url="http://test/v1", api_key="x", http_client=http, max_retries=0)


async def run_streamed(agent, task, client):
    stream = Runner.run_streamed(agent, task, client=client)
    async for _ in stream:
        pass
    return stream.result


@pytest.mark.parametrize("streamed", [False, True])
def test_flagged_calls_are_not_run_and_get_a_repair_turn(streamed, tmp_path):
    calls: list[str] = []
    server = Server(
        [
            ({"content": "", "tool_calls": [VALID], "invalid_tool_calls": [BROKEN, CUT]}, "tool_calls"),
            ({"content": "Oslo is 4 °C."}, "stop"),
        ]
    )
    agent = Agent(name="w", tools=[make_weather(calls)], policies=fast_policies())
    if streamed:
        import asyncio

        result = asyncio.run(run_streamed(agent, "Weather?", server.client()))
    else:
        result = Runner.run_sync(agent, "Weather?", client=server.client(), run_dir=tmp_path / "run")
    assert calls == ["Oslo"]  # only the valid call ran
    assert result.final_output == "Oslo is 4 °C."
    sent = server.bodies[-1]["messages"]
    assert [m["role"] for m in sent] == ["user", "assistant", "tool", "user"]
    assert [c["id"] for c in sent[1]["tool_calls"]] == ["call_ok"]  # the flagged calls are not history
    assert "invalid_tool_calls" not in sent[1]
    repair = sent[3]["content"]
    assert repair.startswith(MALFORMED)
    assert BROKEN["error"] in repair and CUT["error"] in repair and "get_weather" in repair
    if not streamed:
        events = read_log(tmp_path / "run")
        [response] = [e for e in events if e.type == "model_response"][:1]
        assert [c["id"] for c in response.data["invalid_tool_calls"]] == ["call_broken", "call_cut"]
        [repair_event] = [e for e in events if e.type == "message"]
        assert repair_event.data["reason"] == "tool_call_repair"


def test_a_tool_that_keeps_sending_malformed_calls_exhausts_its_retry_budget():
    calls: list[str] = []
    server = Server([({"content": "", "invalid_tool_calls": [BROKEN]}, "tool_calls")])
    agent = Agent(name="w", tools=[make_weather(calls, max_retries=1)], policies=fast_policies(max_steps=10))
    with pytest.raises(LimitExceeded, match="get_weather"):
        Runner.run_sync(agent, "Weather?", client=server.client())
    assert calls == []
    assert len(server.bodies) == 2  # the first repair turn was allowed, the second is over budget


def test_a_resumed_run_goes_on_after_the_repair_turn_and_never_runs_the_flagged_call(tmp_path):
    calls: list[str] = []
    flagged = Server([({"content": "", "invalid_tool_calls": [CUT]}, "length")])
    agent = Agent(name="w", tools=[make_weather(calls)], policies=fast_policies(max_steps=1))
    with pytest.raises(LimitExceeded):  # the flagged response, its repair turn, then the step limit
        Runner.run_sync(agent, "Weather?", client=flagged.client(), run_dir=tmp_path / "run")
    answer = Server([({"content": "", "invalid_tool_calls": [CUT]}, "length"), ({"content": "done"}, "stop")])
    agent = Agent(name="w", tools=[make_weather(calls)], policies=fast_policies(max_steps=3))
    result = Runner.resume_sync(agent, tmp_path / "run", client=answer.client())
    assert result.final_output == "done" and calls == []
    assert answer.bodies[0]["messages"][-1]["content"].startswith(MALFORMED)
    repairs = [e for e in read_log(tmp_path / "run") if e.type == "message"]
    assert len(repairs) == 1  # replaying the log did not owe it again


def dsml_markup(name: str, arguments: dict) -> str:
    """The tool-call block the V4.1 format writes for this call (the real renderer's), as a
    server without the tool-call parser returns it: in `content`."""
    from sglang_ds41.encoding import render_request

    call = {"id": "c", "type": "function", "function": {"name": name, "arguments": json.dumps(arguments)}}
    messages = [
        {"role": "user", "content": "x"},
        {"role": "assistant", "content": "", "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "c", "content": "ok"},
    ]
    text = render_request({"model": "DeepSeek-V4.1-Flash", "messages": messages}).prompt.text
    start = text.index("<｜DSML｜ calls>")
    return text[start : text.index("</｜DSML｜ calls>") + len("</｜DSML｜ calls>")]


def test_raw_tool_call_markup_in_content_is_no_final_answer(serve):
    from sglang_ds41.agents import OutputValidationError
    from sglang_ds41.agents.testing import Reply

    markup = dsml_markup("get_weather", {"city": "Oslo"})
    # The model's call comes back as text; after the repair turn it calls properly.
    call = Reply(tool_calls=[("get_weather", {"city": "Oslo"})])
    fixed = [Reply(content=markup), call, Reply(content="Sunny.")]
    seen: list = []

    @function_tool
    def get_weather(city: str) -> str:
        """Weather for a city."""
        seen.append(city)
        return "sunny"

    agent = Agent(name="w", tools=[get_weather], thinking=False, policies=fast_policies())
    result = Runner.run_sync(agent, "Weather in Oslo?", base_url=serve(fixed, validate=False).base_url)
    assert result.final_output == "Sunny." and seen == ["Oslo"]
    assert result.messages[1]["content"] == markup
    repair = result.messages[2]
    assert repair["role"] == "user" and "tool-call markup" in repair["content"]
    # A server that never parses it: a clear error after the repair budget, never the markup as
    # the answer.
    stuck = [Reply(content=markup)] * 4
    with pytest.raises(OutputValidationError, match=r"tool-call markup.*--tool-call-parser deepseekv41"):
        Runner.run_sync(agent, "Weather in Oslo?", base_url=serve(stuck, validate=False).base_url)
    assert seen == ["Oslo"]
