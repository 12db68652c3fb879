"""The examples run end to end against their scripted servers (the renderer validates requests)."""

from __future__ import annotations

from sglang_ds41.agents import Runner

from tests.examples.commands import load_example


def test_weather_calculator_example():
    ex = load_example("weather_calculator")
    with ex.scripted() as server:
        result = Runner.run_sync(ex.agent, "avg?", base_url=server.base_url)
    tool_results = [m["content"] for m in result.messages if m["role"] == "tool"]
    assert tool_results == ['{"city": "Paris", "celsius": 18.5}', '{"city": "Oslo", "celsius": 4.0}', "11.25"]


def test_file_workspace_example(tmp_path):
    ex = load_example("file_workspace")
    with ex.scripted() as server:
        Runner.run_sync(ex.make_agent(str(tmp_path)), "summarise", base_url=server.base_url)
    assert (tmp_path / "SUMMARY.md").read_text() == "# Summary\n\nNotes collected.\n"


def test_extract_invoice_example_repairs_once():
    ex = load_example("extract_invoice")
    with ex.scripted() as server:
        result = Runner.run_sync(ex.agent, ex.TEXT, base_url=server.base_url)
    assert result.steps == 2 and result.final_output.currency == "EUR" and result.final_output.total == 13.5
