"""`sglang-ds41 agent`: YAML/JSON specs and module paths."""

from __future__ import annotations

import io
import json

import pytest
from sglang_ds41.agents import AgentConfigError
from sglang_ds41.agents.spec import load_agent
from sglang_ds41.agents.testing import Reply

from sglang_ds41.cli import main


def test_yaml_spec_with_workspace_tools_runs(serve, tmp_path, capsys):
    (tmp_path / "ws").mkdir()
    (tmp_path / "ws" / "todo.txt").write_text("buy milk")
    spec = tmp_path / "agent.yaml"
    spec.write_text(
        "name: files\ninstructions: Use the files.\nworkspace: {root: ws, writable: false}\n"
        "reasoning_effort: max\nlimits: {max_steps: 4}\ninput: What is on my list?\n"
    )
    server = serve(
        [
            Reply(reasoning_content="r", tool_calls=[("read_file", {"path": "todo.txt"})]),
            Reply(reasoning_content="r", content="Milk."),
        ]
    )
    assert main(["agent", str(spec), "--base-url", server.base_url]) == 0
    assert capsys.readouterr().out == "Milk.\n"
    assert server.bodies[0]["reasoning_effort"] == "max"
    assert server.bodies[1]["messages"][-1]["content"] == "buy milk"


def test_json_spec_with_output_schema_prints_json(serve, tmp_path, capsys):
    spec = tmp_path / "agent.json"
    schema = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}
    spec.write_text(json.dumps({"name": "num", "output_schema": schema, "thinking": False}))
    server = serve([Reply(content='{"n": 3}')])
    assert main(["agent", str(spec), "--base-url", server.base_url, "--input", "three"]) == 0
    assert json.loads(capsys.readouterr().out) == {"n": 3}


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("name: x\nbogus: 1\n", "unknown keys ['bogus']"),
        ("instructions: hi\n", "needs a 'name'"),
        ("name: x\ntools: [nowhere.mod:fn]\n", "cannot import nowhere.mod"),
        ("name: x\nlimits: {max_stepz: 3}\n", "bad 'limits'"),
        ("name: x\nreasoning_effort: extreme\n", "reasoning_effort must be one of low, high, max"),
        ("name: x\nthinking_token_budget: 0\n", "thinking_token_budget must be an integer of at least 1"),
    ],
)
def test_bad_specs_name_the_problem(tmp_path, text, message):
    spec = tmp_path / "a.yaml"
    spec.write_text(text)
    with pytest.raises(AgentConfigError, match=message.replace("[", r"\[").replace("]", r"\]")):
        load_agent(str(spec))


def test_cli_reports_errors_without_traceback(tmp_path, capsys):
    spec = tmp_path / "a.yaml"
    spec.write_text("name: x\n")
    assert main(["agent", str(spec), "--base-url", "http://127.0.0.1:9/v1"]) == 2
    assert "no input: pass --input" in capsys.readouterr().err


def test_module_path_must_name_an_agent():
    with pytest.raises(AgentConfigError, match="expected an Agent"):
        load_agent("json:dumps")


HELD_AGENT = '''
from sglang_ds41.agents import Agent, function_tool

DONE = []


@function_tool(needs_approval=True)
def delete(name: str) -> str:
    """Delete a thing."""
    DONE.append(name)
    return "deleted " + name


def make():
    return Agent(name="held", tools=[delete], thinking=False)
'''


def test_ask_shows_each_held_back_call_with_its_reason_and_runs_only_what_is_granted(
    serve, tmp_path, capsys, monkeypatch
):
    (tmp_path / "held_agent.py").write_text(HELD_AGENT)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr("sys.stdin", io.StringIO("y\nno\n"))
    calls = [("delete", {"name": "a"}), ("delete", {"name": "b"})]
    server = serve([Reply(tool_calls=calls), Reply(content="done")])
    args = ["agent", "held_agent:make", "--base-url", server.base_url, "--input", "go", "--ask"]
    assert main(args) == 0
    import held_agent

    assert held_agent.DONE == ["a"]
    err = capsys.readouterr().err
    assert err.count("[ask] held back: delete needs approval for every call") == 2
    assert '[ask] delete({"name": "a"})' in err and '[ask] delete({"name": "b"})' in err
    assert "[approval] delete granted (needs approval)" in err
    assert "[approval] delete refused (needs approval)" in err
    tool_results = [m["content"] for m in server.bodies[1]["messages"] if m["role"] == "tool"]
    assert tool_results[0] == "deleted a" and tool_results[1].startswith("Denied: delete needs approval")
