"""`sglang-ds41 agent`: YAML/JSON specs and module paths."""

from __future__ import annotations

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
