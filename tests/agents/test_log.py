"""The event log is durable (fsync'd) before the run acts on it, with one fsync per action, not per event."""

from __future__ import annotations

import json

from sglang_ds41.agents import Agent, Runner, function_tool
from sglang_ds41.agents import log as log_module
from sglang_ds41.agents.testing import Reply, by_turn

from .conftest import fast_policies

SYNCED: list[int] = []  # the number of log lines on disk at each fsync
SEEN_BY_TOOL: list[int] = []


def test_events_are_synced_before_each_tool_runs_and_each_request_is_sent(serve, tmp_path, monkeypatch):
    run_dir = tmp_path / "run"
    log_file = run_dir / "events.jsonl"

    def lines() -> int:
        return len(log_file.read_text().splitlines())

    def counting_sync(fd: int) -> None:
        SYNCED.append(lines())

    @function_tool
    def probe(n: int) -> str:
        """Record how much of the log was durable when the tool started."""
        SEEN_BY_TOOL.append(SYNCED[-1])
        return str(n)

    monkeypatch.setattr(log_module, "_datasync", counting_sync)
    SYNCED.clear()
    SEEN_BY_TOOL.clear()
    synced_at_request: list[int] = []

    def script(body, index):
        synced_at_request.append(SYNCED[-1] if SYNCED else 0)
        return by_turn(
            [
                Reply(reasoning_content="r", tool_calls=[("probe", {"n": 1}), ("probe", {"n": 2})]),
                Reply(reasoning_content="r", content="done"),
            ]
        )(body, index)

    server = serve(script)
    agent = Agent(name="d", tools=[probe], policies=fast_policies())
    Runner.run_sync(agent, "go", base_url=server.base_url, run_dir=run_dir)

    types = [json.loads(line)["type"] for line in log_file.read_text().splitlines()]
    assert types == [
        "run_started",
        "model_response",
        "tool_started",
        "tool_started",
        "tool_finished",
        "tool_finished",
        "model_response",
        "run_finished",
    ]
    # Request 1 after run_started (1 line); the tools after both tool_started (4 lines);
    # request 2 after both results (6 lines); the end of the run syncs the rest (8 lines).
    assert synced_at_request == [1, 6]
    assert SEEN_BY_TOOL == [4, 4]
    assert SYNCED == [1, 4, 6, 8]
