"""An agent that works on files inside one directory (no shell, no way out of the directory).

    sglang-ds41 serve --tiny --port 30000 &
    python examples/agents/file_workspace.py /tmp/ds41-workspace --base-url http://127.0.0.1:30000/v1
    python examples/agents/file_workspace.py /tmp/ds41-workspace --scripted

The tools cannot reach outside the workspace whatever the model asks. `--scripted` plays a
whole run from an in-process scripted server: list the directory, write SUMMARY.md, answer.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from sglang_ds41.agents import Agent, AgentError, Limits, Policies, Runner, workspace_tools


def make_agent(root: str) -> Agent:
    return Agent(
        name="files",
        instructions="You edit files in the workspace with the tools. Keep changes minimal.",
        tools=workspace_tools(root, max_file_bytes=256 * 1024),
        policies=Policies(limits=Limits(max_steps=12, max_tool_calls=30)),
    )


def scripted():
    from sglang_ds41.agents.testing import Reply, ScriptedServer

    return ScriptedServer(
        [
            Reply(reasoning_content="See what is there.", tool_calls=[("list_dir", {"path": "."})]),
            Reply(
                reasoning_content="Write the summary.",
                tool_calls=[
                    ("write_file", {"path": "SUMMARY.md", "content": "# Summary\n\nNotes collected.\n"})
                ],
            ),
            Reply(reasoning_content="Done.", content="Wrote SUMMARY.md."),
        ],
        validate=True,
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("workspace")
    where = parser.add_mutually_exclusive_group(required=True)
    where.add_argument("--base-url", help="the server's OpenAI API: http://127.0.0.1:30000/v1")
    where.add_argument("--scripted", action="store_true", help="an in-process scripted server")
    parser.add_argument("--task", default="List the workspace and write SUMMARY.md describing its files.")
    parser.add_argument("--run-dir", help="keep a resumable event log here")
    args = parser.parse_args()
    Path(args.workspace).mkdir(parents=True, exist_ok=True)
    agent = make_agent(args.workspace)
    try:
        if args.scripted:
            with scripted() as server:
                result = Runner.run_sync(agent, args.task, base_url=server.base_url, run_dir=args.run_dir)
        else:
            result = Runner.run_sync(agent, args.task, base_url=args.base_url, run_dir=args.run_dir)
    except AgentError as error:  # no server, a refused request: one line, not a traceback
        parser.exit(1, f"error: {error}\n")
    print(result.final_output)
