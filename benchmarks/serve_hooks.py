"""The chat stream hook's cost per streamed token, next to upstream SGLang's own path.

    .venv/bin/python benchmarks/serve_hooks.py [--tokens 400] [--repeats 7] [--baseline REV]

Builds SGLang 0.5.23's real `DeepSeekRecipeChatEncodingAdapter` (V4.1 tokenizer, the chat
handler's own hooks) with our plugin loaded, and streams one choice through
`stream_chat_chunks` one id per engine chunk (as `--stream-interval 1` does), until its
finish chunk, for two outputs (plain text; text then a tool call) and two request histories (one
user message; a 401-message agent conversation with 200 earlier calls):

* `upstream`: the adapter's own method (recipe's parser), the peer every ratio is taken to;
* `ours`: the hooked method (`plugin/serving/parsers.py`, `ServedOutput`);
* `baseline` (with --baseline REV): `plugin/serving/parsers.py` of git revision REV in the same run.

Times are medians over --repeats interleaved passes, microseconds per token. The SSE chunks of
`ours` and `baseline` are compared (ids aside) so that a faster hook is also the same hook.
Writes benchmarks/results/serve_hooks.json and prints a short table.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from sglang_ds41.encoding.special_tokens import Special

from sglang_ds41.checkpoint import scripted

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results" / "serve_hooks.json"
_CALL_ID = re.compile(r"call_[0-9a-f]{24}")


def request(history_calls: int):
    """A thinking chat request with tools; `history_calls` earlier assistant turns each made a
    call answered by a tool message (2 * history_calls + 1 messages)."""
    from sglang.srt.entrypoints.openai.protocol import ChatCompletionRequest

    messages: list[dict[str, Any]] = [{"role": "user", "content": "Weather, please."}]
    for i in range(history_calls):
        call = {"id": f"c{i}", "type": "function", "function": {"name": "get_weather", "arguments": "{}"}}
        messages += [
            {"role": "assistant", "content": "", "tool_calls": [call]},
            {"role": "tool", "tool_call_id": f"c{i}", "content": "18 C"},
        ]
    tool = {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}
    return ChatCompletionRequest(
        model="default", messages=messages, tools=[tool], stream=True,
        chat_template_kwargs={"thinking": True},
    )  # fmt: skip


def outputs(tokens: int) -> dict[str, list[int]]:
    """Engine output ids: reasoning then `tokens` ids of plain text; the same then a call."""
    text = scripted.script_ids("The weather in Paris is mild today. " * tokens)[:tokens]
    head = [*scripted.script_ids("Let me answer."), Special.THINK_END.id, *text]
    return {"text": head, "text+call": [*head, *scripted.script_ids(scripted.WEATHER_CALL_TEXT)]}


def stream(method, adapter_obj, chat_request, ids: list[int]) -> list[str]:
    """One streamed choice, one id per chunk, then the finish chunk; the SSE chunks it gave."""
    parser_dict: dict = {}
    has_tool_calls: dict = {}
    sent: list[str] = []
    for n in range(1, len(ids) + 2):
        done = n > len(ids)
        meta = {"id": "chatcmpl-1", "completion_tokens": min(n, len(ids))}
        meta["finish_reason"] = {"type": "stop", "matched": Special.EOS.id} if done else None
        sent += method(
            adapter_obj,
            content={"output_ids": [] if done else [ids[n - 1]], "meta_info": meta},
            index=0, request=chat_request, created=0, parser_dict=parser_dict,
            has_tool_calls=has_tool_calls, choice_logprobs=None,
            finish_reason_type="stop" if done else None, usage=None,
        )  # fmt: skip
    return sent


def baseline_hook(rev: str):
    """`stream_chat_chunks` of the chat hook's module at git revision `rev` (before the plugin's
    split by role it was `plugin/parsers.py`), importing today's `ServedOutput`."""
    for where in ("sglang_ds41/plugin/serving/parsers.py", "sglang_ds41/plugin/parsers.py"):
        command = ["git", "-C", str(ROOT), "show", f"{rev}:{where}"]
        shown = subprocess.run(command, capture_output=True, text=True)
        if shown.returncode == 0:
            source = shown.stdout
            break
    else:
        raise SystemExit(f"--baseline {rev}: no chat hook module at that revision ({shown.stderr.strip()})")
    # The hook's own module, against today's ServedOutput (it moved into plugin/serving/).
    source = source.replace("sglang_ds41.plugin.served_output", "sglang_ds41.plugin.serving.served_output")
    path = Path(tempfile.mkdtemp()) / "parsers_baseline.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location("parsers_baseline", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.stream_chat_chunks


def measure(args: argparse.Namespace) -> dict:
    from sglang.srt.entrypoints.openai.serving_deepseek_recipe import DeepSeekRecipeChatEncodingAdapter
    from sglang.srt.plugins import load_plugins
    from sglang.srt.runtime_context import get_context

    from sglang_ds41.serve.chat_adapter import recipe_chat_adapter

    load_plugins()
    hooked = DeepSeekRecipeChatEncodingAdapter.stream_chat_chunks
    upstream = hooked.__wrapped__
    methods = {"upstream": upstream, "ours": hooked}
    if args.baseline:
        old = baseline_hook(args.baseline)
        methods["baseline"] = lambda self, **kw: old(upstream, self, **kw)
    obj = recipe_chat_adapter()
    rows = []
    with get_context().override_server_args(model_path=str(ROOT), incremental_streaming_output=True):
        for history in (0, 200):
            chat_request = request(history)
            for output, ids in outputs(args.tokens).items():
                times: dict[str, list[float]] = {name: [] for name in methods}
                chunks = {}
                for _ in range(args.repeats):
                    for name, method in methods.items():
                        start = time.perf_counter()
                        chunks[name] = stream(method, obj, chat_request, ids)
                        times[name].append((time.perf_counter() - start) / len(ids))
                if "baseline" in chunks:
                    same = [_CALL_ID.sub("ID", c) for c in chunks["ours"]] == [
                        _CALL_ID.sub("ID", c) for c in chunks["baseline"]
                    ]
                    if not same:
                        raise SystemExit(f"ours and baseline stream different chunks ({output}, {history})")
                us = {name: statistics.median(t) * 1e6 for name, t in times.items()}
                rows.append(
                    {
                        "output": output,
                        "messages": 2 * history + 1,
                        "tokens": len(ids),
                        "us_per_token": us,
                        "ratio_to_upstream": {name: us[name] / us["upstream"] for name in us},
                    }
                )
    return {"python": sys.version.split()[0], "repeats": args.repeats, "baseline": args.baseline,
            "rows": rows}  # fmt: skip


def table(result: dict) -> str:
    names = list(result["rows"][0]["us_per_token"])
    head = "| output | messages | " + " | ".join(f"{n} us/token" for n in names) + " | ours/upstream |"
    if "baseline" in names:
        head += " ours/baseline |"
    lines = [head, "|" + " --- |" * (head.count("|") - 1)]
    for row in result["rows"]:
        us = row["us_per_token"]
        cells = [row["output"], str(row["messages"]), *(f"{us[n]:.1f}" for n in names)]
        cells.append(f"{row['ratio_to_upstream']['ours']:.2f}")
        if "baseline" in us:
            cells.append(f"{us['ours'] / us['baseline']:.2f}")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tokens", type=int, default=400)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--baseline", metavar="REV", help="also time the chat hook of this git revision")
    args = parser.parse_args(argv)
    result = measure(args)
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(result, indent=2) + "\n")
    print(table(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
