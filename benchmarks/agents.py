"""Agent runner overhead per step, excluding model time.

The runner talks to the in-process scripted server, which answers instantly, so the time per
step is the runner's own work plus the HTTP round trip and the tool execution machinery: building
the request, the openai client, parsing the reply, logging (with fsync), running the tool.
The "server only" row times one-message requests sent directly with the sync openai client and
is subtracted to get the runner overhead (which therefore also includes encoding the growing
transcript, up to 2*steps+2 messages). Numbers on a shared 2-core machine are noisy.

    python benchmarks/agents.py [--steps 200]
Writes benchmarks/results/agents.json and prints a short table.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import tempfile
import time
from pathlib import Path

import openai
from sglang_ds41.agents import Agent, Limits, Policies, ProcessExecutor, Runner, ThreadExecutor, function_tool
from sglang_ds41.agents.testing import Reply, ScriptedServer


@function_tool
def echo(text: str) -> str:
    """Echo the text."""
    return text


def script(steps: int):
    def pick(body, index):
        turn = sum(1 for m in body["messages"] if m.get("role") == "assistant")
        if turn >= steps:
            return Reply(reasoning_content="done", content="finished")
        return Reply(reasoning_content="step", tool_calls=[("echo", {"text": f"step {turn}"})])

    return pick


def run_case(steps: int, executor, log: bool, stream: bool) -> float:
    """Seconds per step of a whole run of `steps` tool steps (+1 final answer)."""
    agent = Agent(
        name="bench",
        tools=[echo],
        policies=Policies(limits=Limits(max_steps=steps + 2, max_tool_calls=steps + 1), executor=executor),
    )
    with ScriptedServer(script(steps)) as server, tempfile.TemporaryDirectory() as tmp:
        run_dir = Path(tmp) / "run" if log else None
        start = time.perf_counter()
        if stream:
            import asyncio

            async def go():
                s = Runner.run_streamed(agent, "go", base_url=server.base_url, run_dir=run_dir)
                async for _ in s:
                    pass
                return s.result

            result = asyncio.run(go())
        else:
            result = Runner.run_sync(agent, "go", base_url=server.base_url, run_dir=run_dir)
        elapsed = time.perf_counter() - start
    assert result.steps == steps + 1
    return elapsed / (steps + 1)


def server_only(steps: int) -> float:
    """Seconds per request for the same replies without the runner (HTTP + client cost)."""
    with ScriptedServer(script(steps)) as server:
        client = openai.OpenAI(base_url=server.base_url, api_key="x", max_retries=0)
        messages = [{"role": "user", "content": "go"}]
        start = time.perf_counter()
        for _ in range(steps + 1):
            client.chat.completions.create(model="DeepSeek-V4.1-Flash", messages=messages)
        return (time.perf_counter() - start) / (steps + 1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    base = statistics.median(server_only(args.steps) for _ in range(args.repeats))
    cases = {
        "thread tools, no log": (ThreadExecutor(), False, False),
        "thread tools, fsync'd log": (ThreadExecutor(), True, False),
        "process tools (default), fsync'd log": (ProcessExecutor(), True, False),
        "process tools, fsync'd log, streamed": (ProcessExecutor(), True, True),
    }
    rows = []
    for name, (executor, log, stream) in cases.items():
        per_step = statistics.median(run_case(args.steps, executor, log, stream) for _ in range(args.repeats))
        rows.append(
            {
                "case": name,
                "ms_per_step": round(per_step * 1e3, 3),
                "overhead_ms_per_step": round((per_step - base) * 1e3, 3),
            }
        )
    out = {
        "benchmark": "agents runner overhead per step",
        "steps": args.steps,
        "repeats": args.repeats,
        "server_only_ms_per_request": round(base * 1e3, 3),
        "rows": rows,
        "machine": {"python": platform.python_version(), "platform": platform.platform()},
    }
    path = Path(__file__).resolve().parent / "results" / "agents.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(out, indent=2) + "\n")
    print(f"server + client only: {base * 1e3:.2f} ms/request")
    print(f"{'case':40} {'ms/step':>9} {'overhead':>9}")
    for row in rows:
        print(f"{row['case']:40} {row['ms_per_step']:9.2f} {row['overhead_ms_per_step']:9.2f}")
    print(f"-> {path}")


if __name__ == "__main__":
    main()
