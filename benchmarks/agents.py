"""Agent runner overhead per step, excluding model time and the test server's own work.

The runner talks to the in-process scripted server (`sglang_ds41.agents.testing`), which answers
instantly but still does work per request: it decodes the whole (growing) request JSON, builds
and encodes the reply. That work is not the runner's, so the server records, per request, the
CPU time of its handler thread (`ScriptedServer.timings`), and this script subtracts exactly that.

A step is measured from the server's side: from the arrival of request i to the arrival of
request i+1. That cycle is the server handling request i plus everything the client did before
the next request arrived: receiving and parsing the reply, the openai client, the event log
writes (+fsync), the tool execution machinery, building and sending the next request. So

    client overhead of step i = (arrival[i+1] - arrival[i]) - server_cpu[i]

Reported per run: median and p90 over its tool steps, and the median of the last 10 steps
(where the transcript is longest, so O(n)-per-step costs show). The "bare openai client" rows
send the same growing transcript with the AsyncOpenAI client and no runner: the part of the
overhead that no runner change can remove. Streamed requests open a new connection each (the
scripted server closes streams), which the bare streamed row shows too. The machine has 2
shared cores: use medians, and compare runs made close together.

    python benchmarks/agents.py [--steps 10 50 200] [--repeats 1] [--quick]
Writes benchmarks/results/agents.json and prints a short table.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import platform
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import openai
from sglang_ds41.agents import Agent, Limits, Policies, ProcessExecutor, Runner, ThreadExecutor, function_tool
from sglang_ds41.agents.testing import Reply, ScriptedServer

MODEL = "DeepSeek-V4.1-Flash"


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


def client_ms(server: ScriptedServer, end: float) -> tuple[list[float], dict[str, float]]:
    """Per-step client time (ms) for each request but the last, and the server totals."""
    timings = server.wait_for_timings(len(server.requests))
    posts = sorted((t for t in timings if t.path.endswith("/chat/completions")), key=lambda t: t.start)
    arrivals = [t.start for t in posts] + [end]
    steps = [(arrivals[i + 1] - arrivals[i] - t.cpu_s) * 1e3 for i, t in enumerate(posts)]
    totals = {
        "server_cpu_ms_per_request": statistics.fmean(t.cpu_s for t in posts) * 1e3,
        "server_wall_ms_per_request": statistics.fmean(t.wall_s for t in posts) * 1e3,
    }
    return steps[:-1], totals  # the last cycle is the final answer plus teardown, not a tool step


def run_case(steps: int, executor: str, log: bool, stream: bool) -> tuple[list[float], dict[str, float]]:
    agent = Agent(
        name="bench",
        tools=[echo],
        policies=Policies(
            limits=Limits(max_steps=steps + 2, max_tool_calls=steps + 1),
            executor=ProcessExecutor() if executor == "process" else ThreadExecutor(),
        ),
    )
    with ScriptedServer(script(steps)) as server, tempfile.TemporaryDirectory() as tmp:
        run_dir = Path(tmp) / "run" if log else None

        async def go():
            if not stream:
                return await Runner.run(agent, "go", base_url=server.base_url, run_dir=run_dir)
            s = Runner.run_streamed(agent, "go", base_url=server.base_url, run_dir=run_dir)
            async for _ in s:
                pass
            return s.result

        result = asyncio.run(go())
        end = time.perf_counter()
    assert result.steps == steps + 1, result.steps
    return client_ms(server, end)


def bare_client(steps: int, stream: bool) -> tuple[list[float], dict[str, float]]:
    """The same requests (growing transcript, tools, extra_body) from a bare AsyncOpenAI client."""
    tools = [echo.to_openai()]
    extra = {"thinking": {"type": "enabled"}, "chat_template_kwargs": {"thinking": True}}

    async def go(base_url: str) -> None:
        client = openai.AsyncOpenAI(base_url=base_url, api_key="x", max_retries=0)
        messages: list[dict[str, Any]] = [{"role": "user", "content": "go"}]
        for turn in range(steps + 1):
            body = {"model": MODEL, "messages": messages, "tools": tools, "extra_body": extra}
            if stream:
                chunks = await client.chat.completions.create(**body, stream=True)
                async for _ in chunks:
                    pass
            else:
                await client.chat.completions.create(**body)
            call = {
                "id": f"call_{turn}_0",
                "type": "function",
                "function": {"name": "echo", "arguments": json.dumps({"text": f"step {turn}"})},
            }
            messages = [
                *messages,
                {"role": "assistant", "content": "", "reasoning_content": "step", "tool_calls": [call]},
                {"role": "tool", "tool_call_id": call["id"], "content": f"step {turn}"},
            ]
        await client.close()

    with ScriptedServer(script(steps)) as server:
        asyncio.run(go(server.base_url))
        end = time.perf_counter()
    return client_ms(server, end)


def summary(samples: list[float]) -> dict[str, float]:
    ordered = sorted(samples)
    p90 = ordered[min(len(ordered) - 1, int(0.9 * len(ordered)))]
    return {
        "median_ms": round(statistics.median(ordered), 3),
        "p90_ms": round(p90, 3),
        "last10_median_ms": round(statistics.median(samples[-10:]), 3),
    }


def cases(quick: bool) -> list[tuple[str, str, bool, bool]]:
    """(label, executor, log, stream). Bare-client rows use executor "-"."""
    out = [("bare openai client", "-", False, False), ("bare openai client, streamed", "-", False, True)]
    for executor in ("thread", "process"):
        for log in (False, True):
            for stream in (False, True):
                if quick and stream and executor == "thread":
                    continue
                label = (
                    f"{executor} tools, {'fsync log' if log else 'no log'}{', streamed' if stream else ''}"
                )
                out.append((label, executor, log, stream))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, nargs="+", default=[10, 50, 200])
    parser.add_argument("--repeats", type=int, default=1, help="runs per case; their steps are pooled")
    parser.add_argument("--quick", action="store_true", help="skip the streamed thread-executor rows")
    parser.add_argument(
        "--out", type=Path, default=Path(__file__).resolve().parent / "results" / "agents.json"
    )
    args = parser.parse_args()
    rows = []
    for steps in args.steps:
        for label, executor, log, stream in cases(args.quick):
            samples: list[float] = []
            totals: list[dict[str, float]] = []
            for _ in range(args.repeats):
                if executor == "-":
                    got, total = bare_client(steps, stream)
                else:
                    got, total = run_case(steps, executor, log, stream)
                samples += got
                totals.append(total)
            row = {
                "case": label,
                "steps": steps,
                "executor": executor,
                "log": log,
                "stream": stream,
                **summary(samples),
                **{k: round(statistics.median(t[k] for t in totals), 3) for k in totals[0]},
            }
            rows.append(row)
            print(
                f"{steps:5d}  {label:38} {row['median_ms']:8.2f} {row['p90_ms']:8.2f} "
                f"{row['last10_median_ms']:8.2f}   server {row['server_cpu_ms_per_request']:.2f}",
                flush=True,
            )
    out = {
        "benchmark": "agents runner client-side overhead per step (server handling CPU time subtracted)",
        "repeats": args.repeats,
        "rows": rows,
        "machine": {
            "python": platform.python_version(),
            "platform": platform.platform(),
            "openai": openai.__version__,
        },
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=2) + "\n")
    print(table(rows))
    print(f"-> {args.out}")


def table(rows: list[dict[str, Any]]) -> str:
    """Client ms per step: median / p90 / last-10 median, one column per transcript length."""
    lengths = sorted({r["steps"] for r in rows})
    labels = list(dict.fromkeys(r["case"] for r in rows))
    head = f"{'client ms/step (median/p90/last10)':38}" + "".join(f"{f'steps={n}':>22}" for n in lengths)
    lines = [head]
    for label in labels:
        cells = []
        for n in lengths:
            r = next((r for r in rows if r["case"] == label and r["steps"] == n), None)
            cells.append(
                f"{r['median_ms']:6.1f}/{r['p90_ms']:6.1f}/{r['last10_median_ms']:6.1f}" if r else "-"
            )
        lines.append(f"{label:38}" + "".join(f"{c:>22}" for c in cells))
    return "\n".join(lines)


if __name__ == "__main__":
    main()
