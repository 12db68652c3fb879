"""`sglang-ds41 agent SPEC --base-url URL`: run (or resume) an agent against a chat server."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys

NAME = "agent"
HELP = "Run a tool-calling agent (module path pkg.mod:agent, or a YAML/JSON spec) against a server."


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "spec", help="pkg.module:agent (an Agent or a function returning one), or a spec file"
    )
    parser.add_argument(
        "--base-url", required=True, help="OpenAI-compatible base URL, e.g. http://127.0.0.1:30000/v1"
    )
    parser.add_argument("--api-key", default=None, help="API key (default: $OPENAI_API_KEY or 'EMPTY')")
    parser.add_argument("--input", default=None, help="the user message (default: the spec's 'input')")
    parser.add_argument("--run-dir", default=None, help="write the resumable event log to this directory")
    parser.add_argument(
        "--resume", metavar="RUN_DIR", default=None, help="continue the run logged in RUN_DIR"
    )
    parser.add_argument("--stream", action="store_true", help="print reasoning and content as they arrive")
    parser.add_argument(
        "--json", action="store_true", help="print the result (output, usage, messages) as JSON"
    )


def run(args: argparse.Namespace) -> int:
    from sglang_ds41.agents import Runner
    from sglang_ds41.agents.errors import AgentConfigError
    from sglang_ds41.agents.output import to_jsonable
    from sglang_ds41.agents.spec import load_agent

    # Like `python -m`: user modules named in the spec resolve from the current directory.
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    agent, default_input = load_agent(args.spec)
    common = {"base_url": args.base_url, "api_key": args.api_key}
    if args.resume:
        result = Runner.resume_sync(agent, args.resume, **common)
    else:
        text = args.input if args.input is not None else default_input
        if text is None:
            raise AgentConfigError("no input: pass --input TEXT or set 'input' in the spec")
        if args.stream:
            result = asyncio.run(_streamed(agent, text, args.run_dir, common))
        else:
            result = Runner.run_sync(agent, text, run_dir=args.run_dir, **common)
    output = to_jsonable(result.final_output)
    if args.json:
        summary = {
            "final_output": output,
            "steps": result.steps,
            "tool_calls": result.tool_calls,
            "usage": vars(result.usage),
            "messages": result.messages,
            "run_dir": result.run_dir,
        }
        print(json.dumps(summary, ensure_ascii=False, indent=2))
    else:
        print(output if isinstance(output, str) else json.dumps(output, ensure_ascii=False, indent=2))
    for warning in result.warnings:
        print(f"warning: {warning}", file=sys.stderr)
    return 0


async def _streamed(agent, text, run_dir, common):
    from sglang_ds41.agents import Runner

    stream = Runner.run_streamed(agent, text, run_dir=run_dir, **common)
    async for event in stream:
        if event.type in ("reasoning_delta", "content_delta"):
            sys.stderr.write(event.data["text"])
        elif event.type == "tool_started":
            sys.stderr.write(f"\n[tool] {event.data['name']}({event.data['arguments']})\n")
        elif event.type == "retry":
            sys.stderr.write(f"\n[retry {event.data['attempt']}] {event.data['error']}\n")
    sys.stderr.write("\n")
    return stream.result
