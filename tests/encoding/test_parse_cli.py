"""`sglang-ds41 parse` run as a user would, in a subprocess."""

from __future__ import annotations

import json
import subprocess
import sys

from .parse_oracle import D, model_ids

COMPLETION = (
    "Need weather.</think>Let me check.\n\n"
    f'<{D} calls>\n<{D} invoke name="get_weather">\n'
    f'<{D} parameter name="city" string="true">Paris</{D} parameter>\n</{D} invoke>\n</{D} calls>'
)


def cli(*args: str, stdin: str = "") -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "sglang_ds41.cli", "parse", *args],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_parses_text_from_stdin_into_an_openai_message():
    done = cli("--tools", "--seed", "3", stdin=COMPLETION)
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    assert out["finish_reason"] == "tool_calls" and out["valid"] is True
    message = out["message"]
    assert (message["reasoning_content"], message["content"]) == ("Need weather.", "Let me check.")
    (call,) = message["tool_calls"]
    assert call["function"] == {"name": "get_weather", "arguments": '{"city": "Paris"}'}
    assert call["id"].startswith("call_00_")
    assert json.loads(cli("--tools", "--seed", "3", stdin=COMPLETION).stdout) == out


def test_parses_token_ids_from_a_file(tmp_path):
    path = tmp_path / "ids.json"
    path.write_text(json.dumps(model_ids(COMPLETION)))
    done = cli(str(path), "--ids", "--tools")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["message"]["tool_calls"][0]["function"]["name"] == "get_weather"


def test_reports_problems_and_truncation():
    done = cli(
        "--no-thinking", "--tools", "--finish-reason", "length", stdin=COMPLETION.split("Paris")[0] + "Par"
    )
    out = json.loads(done.stdout)
    assert out["valid"] is False and out["finish_reason"] == "length"
    assert "call truncated at max_tokens" in out["tool_calls"][0]["problems"]


def test_without_tools_dsml_stays_content():
    out = json.loads(cli(stdin=COMPLETION).stdout)
    assert out["message"]["content"].startswith("Let me check.\n\n<｜DSML｜ calls>")


def test_bad_input_is_a_clear_error():
    done = cli("--ids", stdin="not json")
    assert done.returncode == 2
    assert "--ids expects a JSON list of token ids" in done.stderr and "Traceback" not in done.stderr
    missing = cli("/no/such/file.txt")
    assert missing.returncode == 2 and "cannot read completion file" in missing.stderr


def test_tolerant_reads_the_ascii_spelling_as_the_call_and_says_so():
    ascii_bars = COMPLETION.replace(D, "|DSML|")
    plain = json.loads(cli("--tools", stdin=ascii_bars).stdout)
    assert plain["message"]["content"].startswith("Let me check.\n\n<|DSML| calls>")  # the official reading
    done = cli("--tools", "--tolerant", stdin=ascii_bars)
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    assert out["message"]["content"] == "Let me check."
    (call,) = out["message"]["tool_calls"]
    assert call["function"] == {"name": "get_weather", "arguments": '{"city": "Paris"}'}
    assert out["tool_calls"][0]["repairs"] == ['DSML written "|DSML|" (ASCII bars)']
