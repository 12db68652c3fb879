"""A real server (`sglang-ds41 serve --scripted`, our CPU engine) encodes an agent's growing history
through the plugin's incremental encoder, and every turn's prompt ids are the official
renderer's (deepseek-recipe) for the same request; with `--no-incremental-encoding` upstream's
own adapter encodes them, to the same ids."""

from __future__ import annotations

import json

import openai
import pytest
from sglang_ds41.encoding.incremental import DEFAULT_MAX_BYTES

from sglang_ds41.checkpoint.scripted import write_scripted_checkpoint
from sglang_ds41.plugin.serving import prompt_encoding
from tests.encoding.oracle import wheel

from .requests import WEATHER_TOOL
from .server import Server, running_server

pytestmark = pytest.mark.integration

READY = prompt_encoding.READY % (DEFAULT_MAX_BYTES >> 20, prompt_encoding.SWITCH_ENV)
OFF = prompt_encoding.UPSTREAM % f"{prompt_encoding.SWITCH_ENV} is off"


@pytest.fixture(scope="module")
def upstream_server(tmp_path_factory) -> Server:
    """The scripted model served with `--no-incremental-encoding`."""
    root = tmp_path_factory.mktemp("upstream-encoding-server")
    model_dir = write_scripted_checkpoint(root / "checkpoint")
    with running_server(model_dir, ["--no-incremental-encoding"], log_path=root / "server.log") as server:
        yield server
    assert server.stopped_cleanly, f"serve did not stop its server cleanly on SIGTERM; log {server.log_path}"


@pytest.fixture(scope="module", params=["incremental", "upstream"])
def server(request) -> Server:
    return request.getfixturevalue("scripted_server" if request.param == "incremental" else "upstream_server")


def official_ids(messages: list[dict], **extra) -> list[int]:
    body = {"model": "DeepSeek-V4.1-Flash", "messages": messages, "tools": [WEATHER_TOOL], **extra}
    return list(wheel(body).ids)


def served_prompt_ids(server: Server, messages: list[dict], **extra) -> list[int]:
    client = openai.OpenAI(base_url=server.openai_url, api_key="unused", timeout=120, max_retries=0)
    completion = client.chat.completions.create(
        model="default",
        messages=messages,
        tools=[WEATHER_TOOL],
        max_tokens=1,
        extra_body={"return_prompt_token_ids": True, **extra},
    )
    return completion.choices[0].model_extra["prompt_token_ids"]


@pytest.mark.parametrize("thinking", [None, {"type": "disabled"}], ids=["thinking", "no-thinking"])
def test_each_turn_of_an_agent_loop_gets_the_official_ids(server, thinking):
    extra = {} if thinking is None else {"thinking": thinking}
    messages: list[dict] = [
        {"role": "system", "content": "You answer weather questions with the tool."},
        {"role": "user", "content": "Weather in Paris, then in Oslo, then in Lima?"},
    ]
    for n, city in enumerate(["Paris", "Oslo", "Lima", "Paris"]):
        assert served_prompt_ids(server, messages, **extra) == official_ids(messages, **extra), f"turn {n}"
        function = {"name": "get_weather", "arguments": json.dumps({"city": city, "unit": "c"})}
        call = {"id": f"call_{n}", "type": "function", "function": function}
        reply = {"role": "assistant", "content": "", "reasoning_content": f"{city}?", "tool_calls": [call]}
        result = {"role": "tool", "tool_call_id": f"call_{n}", "content": json.dumps({"temp_c": 10 + n})}
        messages = [*messages, reply, result]
    # A client that edits an earlier turn is encoded from the edit on, and still exactly.
    messages[3] = {**messages[3], "content": '{"temp_c": 30}'}
    assert served_prompt_ids(server, messages, **extra) == official_ids(messages, **extra)


def test_the_log_says_who_encodes_the_prompts(server, request):
    log = server.log_path.read_text()
    incremental = request.node.callspec.params["server"] == "incremental"
    assert (READY in log) == incremental
    assert (OFF in log) != incremental
