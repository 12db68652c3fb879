"""`sglang-ds41 agent SPEC --base-url URL`: run (or resume) an agent against a chat server.

Progress goes to stderr, one line per step and per tool call, so a slow server is never silent;
the answer goes to stdout once. With `--stream`, the reasoning streams to stderr (marked) and the
content to stdout as it arrives, and the answer is not printed again.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import os
import sys
import time

NAME = "agent"
HELP = "Run a tool-calling agent (module path pkg.mod:agent, or a YAML/JSON spec) against a server."


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "spec", help="pkg.module:agent (an Agent or a function returning one), or a spec file"
    )
    parser.add_argument(
        "--base-url",
        required=True,
        help="the server's OpenAI API, with /v1 as for the openai client: http://127.0.0.1:30000/v1",
    )
    parser.add_argument("--api-key", default=None, help="API key (default: $OPENAI_API_KEY or 'EMPTY')")
    parser.add_argument("--input", default=None, help="the user message (default: the spec's 'input')")
    parser.add_argument(
        "--max-tokens",
        type=int,
        default=None,
        metavar="N",
        help="token budget of each model request (default: the spec's model_settings, else 4096)",
    )
    parser.add_argument("--run-dir", default=None, help="write the resumable event log to this directory")
    parser.add_argument(
        "--resume", metavar="RUN_DIR", default=None, help="continue the run logged in RUN_DIR"
    )
    parser.add_argument(
        "--stream",
        action="store_true",
        help="stream the reasoning (stderr, marked) and the content (stdout) as they arrive",
    )
    parser.add_argument(
        "--ask",
        action="store_true",
        help="ask on stdin before a held-back call runs (a tool that needs approval, or a call the "
        "untrusted-content policy holds back), showing why; default: the agent's approval policy",
    )
    parser.add_argument("--quiet", action="store_true", help="no progress lines on stderr")
    parser.add_argument(
        "--json", action="store_true", help="print the result (output, usage, messages) as JSON"
    )


def run(args: argparse.Namespace) -> int:
    from sglang_ds41.agents import Runner
    from sglang_ds41.agents.errors import AgentConfigError
    from sglang_ds41.agents.model_turn import request_token_limit
    from sglang_ds41.agents.output import to_jsonable
    from sglang_ds41.agents.spec import load_agent

    # Like `python -m`: user modules named in the spec resolve from the current directory.
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    agent, default_input = load_agent(args.spec)
    if args.max_tokens is not None:
        if args.max_tokens < 1:
            raise AgentConfigError(f"--max-tokens must be a positive integer, got {args.max_tokens}")
        agent = dataclasses.replace(
            agent, model_settings={**agent.model_settings, "max_tokens": args.max_tokens}
        )
    budget = request_token_limit(agent.model_settings)
    progress = Progress(
        sys.stderr, quiet=args.quiet, stream=args.stream, content_to=sys.stderr if args.json else sys.stdout
    )
    if args.ask:
        from sglang_ds41.agents import ApproveWith

        ask = AskOnConsole(sys.stdin, sys.stderr, progress)
        agent = dataclasses.replace(
            agent, policies=dataclasses.replace(agent.policies, approval=ApproveWith(ask))
        )
    common = {"base_url": args.base_url, "api_key": args.api_key}
    progress.line(
        f"[agent] {agent.name}: {len(agent.tools)} tools, {agent.model} at {args.base_url}, "
        f"up to {budget if budget is not None else 'the server default'} tokens per request"
    )
    if args.resume:
        result = Runner.resume_sync(agent, args.resume, on_event=progress, **common)
    else:
        text = args.input if args.input is not None else default_input
        if text is None:
            raise AgentConfigError("no input: pass --input TEXT or set 'input' in the spec")
        if args.stream:
            result = asyncio.run(_streamed(agent, text, args.run_dir, common, progress))
        else:
            result = Runner.run_sync(agent, text, run_dir=args.run_dir, on_event=progress, **common)
    progress.done(result)
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
    elif not (args.stream and progress.streamed_content):
        print(output if isinstance(output, str) else json.dumps(output, ensure_ascii=False, indent=2))
    for warning in result.warnings:
        print(f"warning: {warning}", file=sys.stderr)
    return 0


class Progress:
    """Called with every run event: one stderr line per step and tool call; with `stream`, the
    reasoning deltas to stderr behind a `[thinking]` mark and the content deltas to `content_to`."""

    def __init__(self, err, *, quiet: bool, stream: bool, content_to) -> None:
        self.err, self.quiet, self.stream, self.content_to = err, quiet, stream, content_to
        self.t0 = self.step_t0 = time.monotonic()
        self.mode: str | None = None  # what the stream is writing now: "reasoning", "content" or None
        self.streamed_content = False

    def line(self, text: str) -> None:
        self.end_stream()
        if not self.quiet:
            self.err.write(text + "\n")
            self.err.flush()

    def end_stream(self) -> None:
        if self.mode == "reasoning":
            self.err.write("\n")
        elif self.mode == "content":
            self.content_to.write("\n")
            self.content_to.flush()
        self.mode = None

    def __call__(self, event) -> None:
        kind, data = event.type, event.data
        if kind == "reasoning_delta":
            if self.mode != "reasoning":
                self.end_stream()
                self.err.write("[thinking] ")
                self.mode = "reasoning"
            self.err.write(data["text"])
            self.err.flush()
        elif kind == "content_delta":
            if self.mode != "content":
                self.end_stream()
                if self.content_to is self.err:  # --json: stdout is for the summary
                    self.err.write("[content] ")
                self.mode = "content"
            self.content_to.write(data["text"])
            self.content_to.flush()
            self.streamed_content = True
        elif kind == "step_started":
            self.step_t0 = time.monotonic()
            limit = data.get("max_tokens")
            self.line(
                f"[step {data['step']}] waiting for the model (up to {limit or 'the server default'} tokens)"
            )
        elif kind == "model_response":
            usage = data.get("usage") or {}
            calls = data["message"].get("tool_calls") or []
            what = f"{len(calls)} tool call{'s' if len(calls) != 1 else ''}" if calls else "answer"
            if data.get("finish_reason") == "length":
                what += " (cut off at the token limit)"
            self.line(
                f"[step {data['step']}] {usage.get('prompt_tokens', '?')} prompt + "
                f"{usage.get('completion_tokens', '?')} completion tokens in "
                f"{time.monotonic() - self.step_t0:.1f} s: {what}"
            )
        elif kind == "tool_started":
            self.line(f"[tool] {data['name']}({_short(data['arguments'])})")
        elif kind == "tool_finished":
            self.line(f"[tool] {data['name']} -> {data['status']}: {_short(data['result'])}")
        elif kind == "approval":
            answer = "granted" if data["granted"] else "refused"
            self.line(f"[approval] {data['name']} {answer} ({data['rule']}): {_short(data['reason'])}")
        elif kind == "message" and data.get("reason") == "repair":
            self.line("[repair] the answer did not match the output schema; asking again")
        elif kind == "retry":
            self.line(f"[retry {data['attempt']}] {data['error']}")
        elif kind == "warning":
            self.line(f"[warning] {data['message']}")

    def done(self, result) -> None:
        self.line(
            f"[done] {result.steps} steps, {result.tool_calls} tool calls, "
            f"{result.usage.total_tokens} tokens, {time.monotonic() - self.t0:.1f} s"
        )
        self.end_stream()


class AskOnConsole:
    """`--ask`: shows a held-back call and why, and reads y/N from `answers` (end of input: no)."""

    def __init__(self, answers, err, progress: Progress) -> None:
        self.answers, self.err, self.progress = answers, err, progress

    def __call__(self, name: str, arguments: dict, why) -> bool:
        self.progress.end_stream()
        # The whole call, as it would run: nothing shortened or folded that the user approves.
        shown = json.dumps(arguments, ensure_ascii=False)
        self.err.write(f"[ask] {name}({shown})\n[ask] held back: {why}\n[ask] run it? [y/N] ")
        self.err.flush()
        answer = self.answers.readline()
        if not answer:
            self.err.write("\n")
        return answer.strip().lower() in ("y", "yes")


def _short(text: str, limit: int = 160) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


async def _streamed(agent, text, run_dir, common, progress):
    from sglang_ds41.agents import Runner

    stream = Runner.run_streamed(agent, text, run_dir=run_dir, **common)
    async for event in stream:
        progress(event)
    return stream.result
