"""What `sglang-ds41 agent` prints: progress per step and per tool call on stderr, the answer once
on stdout; `--stream` keeps reasoning (stderr, marked) and content (stdout) apart; every request
has a token budget. Against the scripted in-process server, whose recorded bodies are the wire."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from sglang_ds41.agents import Agent, Runner
from sglang_ds41.agents.model_turn import DEFAULT_MAX_TOKENS
from sglang_ds41.agents.testing import Reply, by_turn

from sglang_ds41.cli import main

SPEC = Path(__file__).resolve().parents[2] / "examples" / "agents" / "weather.yaml"
ANSWER = "Paris 18.5 °C, Oslo 4.0 °C; the average is 11.25 °C."
THOUGHTS = ["Look up both cities.", "Average them.", "Done."]
REPLIES = [
    Reply(
        reasoning_content=THOUGHTS[0],
        tool_calls=[("get_weather", {"city": "Paris"}), ("get_weather", {"city": "Oslo"})],
    ),
    Reply(reasoning_content=THOUGHTS[1], tool_calls=[("calculate", {"expression": "(18.5 + 4.0) / 2"})]),
    Reply(reasoning_content=THOUGHTS[2], content=ANSWER),
]


def agent_cli(serve, capsys, *args: str):
    server = serve(by_turn(REPLIES))
    code = main(["agent", str(SPEC), "--base-url", server.base_url, *args])
    out, err = capsys.readouterr()
    return code, out, err, server.bodies


def test_progress_lines_on_stderr_and_the_answer_once_on_stdout(serve, capsys):
    code, out, err, bodies = agent_cli(serve, capsys)
    assert code == 0 and out == ANSWER + "\n"
    lines = err.splitlines()
    assert lines[0].startswith("[agent] weather-calculator: 2 tools, DeepSeek-V4.1-Flash at http://")
    assert lines[1] == f"[step 1] waiting for the model (up to {DEFAULT_MAX_TOKENS} tokens)"
    assert lines[2].startswith("[step 1] ") and lines[2].endswith(": 2 tool calls")
    assert '[tool] get_weather({"city": "Paris"})' in lines
    assert "[tool] calculate -> ok: 11.25" in lines
    assert any(line.startswith("[step 3] ") and line.endswith(": answer") for line in lines)
    assert lines[-1].startswith("[done] 3 steps, 3 tool calls, ")
    assert ANSWER not in err
    assert all("stream" not in body for body in bodies)  # progress without streaming the requests


def test_every_request_has_a_token_budget_and_max_tokens_sets_it(serve, capsys):
    *_, bodies = agent_cli(serve, capsys)
    assert [b["max_tokens"] for b in bodies] == [DEFAULT_MAX_TOKENS] * 3 == [4096] * 3
    code, _, err, bodies = agent_cli(serve, capsys, "--max-tokens", "64")
    assert code == 0 and [b["max_tokens"] for b in bodies] == [64] * 3
    assert "(up to 64 tokens)" in err


def test_model_settings_none_sends_no_budget(serve):
    server = serve(by_turn(REPLIES[2:]))
    agent = Agent(name="a", model_settings={"max_tokens": None})
    assert Runner.run_sync(agent, "hi", base_url=server.base_url).final_output == ANSWER
    assert "max_tokens" not in server.bodies[0]


def test_stream_keeps_reasoning_and_content_apart_and_prints_the_answer_once(serve, capsys):
    code, out, err, bodies = agent_cli(serve, capsys, "--stream")
    assert code == 0 and all(body["stream"] for body in bodies)
    assert out == ANSWER + "\n"  # streamed content only; not printed a second time
    for thought in THOUGHTS:
        assert f"[thinking] {thought}\n" in err and thought not in out
    assert ANSWER not in err
    assert (
        err.index("[thinking] Look up both cities.") < err.index("[tool] get_weather") < err.index("[done]")
    )


def test_stream_with_json_keeps_stdout_for_the_summary(serve, capsys):
    code, out, err, _ = agent_cli(serve, capsys, "--stream", "--json", "--quiet")
    assert code == 0
    assert json.loads(out)["final_output"] == ANSWER
    assert err == "".join(f"[thinking] {t}\n" for t in THOUGHTS) + f"[content] {ANSWER}\n"  # no progress


def test_on_event_sees_each_step_without_streaming(serve):
    server = serve(by_turn(REPLIES))
    from tests.examples.commands import load_example

    example = load_example("weather_calculator")
    seen = []
    result = Runner.run_sync(example.agent, "go", base_url=server.base_url, on_event=seen.append)
    assert result.final_output == ANSWER
    kinds = [e.type for e in seen]
    assert kinds.count("step_started") == 3 and kinds.count("model_response") == 3
    assert kinds.index("step_started") < kinds.index("model_response") < kinds.index("tool_started")
    assert "reasoning_delta" not in kinds  # not streamed
    assert [e.data["max_tokens"] for e in seen if e.type == "step_started"] == [DEFAULT_MAX_TOKENS] * 3


def test_the_spec_finds_its_tool_module_beside_it_from_any_directory(serve, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # the CLI adds the cwd to sys.path; the tools must come from beside the spec
    monkeypatch.delitem(__import__("sys").modules, "weather_calculator", raising=False)
    code, out, _, _ = agent_cli(serve, capsys)
    assert code == 0 and out == ANSWER + "\n"


@pytest.mark.parametrize(
    ("settings", "limit"),
    [
        ({}, 4096),
        ({"max_tokens": 100}, 100),
        ({"max_tokens": None}, None),  # none sent: the server's default
        ({"max_completion_tokens": 50, "max_tokens": 100}, 50),  # what SGLang reads first
    ],
)
def test_the_start_line_names_the_limit_each_request_asks_for(settings, limit):
    from sglang_ds41.agents.model_turn import request_token_limit

    assert request_token_limit(settings) == limit
