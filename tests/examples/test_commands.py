"""Every command the README and the example files show is run by a test, as written, from a
directory outside the repository (see `commands.Session` for the only substitutions).

The README's Examples block is the list: example files may show only its lines, and
scripts/demo.sh runs exactly its lines. Its segments run here (no server; the scripted-model
server, integration) and in tests/test_packaging_venvs.py (the tiny-model server, from a fresh
venv with the serve extra; slow: a 6 GB venv). Other README blocks are classified below, each
with the test that covers it or why none can run here.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest

from tests.examples.commands import (
    EXAMPLES,
    README,
    REPO,
    Session,
    bash_blocks,
    example_file_commands,
    load_example,
    readme_examples,
    segments,
)
from tests.integration.server import free_port

EXAMPLE_QUESTION = load_example("weather_calculator").QUESTION
BIN = Path(sys.executable).parent

# The README's other ```bash blocks, by their first line: what runs them.
OTHER_BLOCKS = {
    "scripts/demo.sh": "runs the Examples block (test_demo_runs_exactly_the_readme_examples); "
    "scripts/test.sh is what CI runs (.ci/run)",
    "scripts/setup-gpu.sh": "NVIDIA GPUs only (4 of them for the real model); nothing here can run it",
    "pip install sglang-ds41": "tests/test_packaging_venvs.py installs each of these into a fresh venv",
    "sglang-ds41 --version": "the command synopsis (placeholders); each command's own tests, and the "
    "Examples block for runnable lines",
}


def test_every_readme_block_is_the_examples_or_classified():
    blocks = bash_blocks(README.read_text(encoding="utf-8"))
    examples = readme_examples()
    firsts = [block[0] for block in blocks if block != examples]
    assert sorted(firsts) == sorted(OTHER_BLOCKS), "a README block without a test: classify it here"
    assert len(blocks) == len(OTHER_BLOCKS) + 1


def test_example_files_show_only_commands_of_the_readme_examples():
    allowed = set(readme_examples())
    shown = example_file_commands()
    assert {
        "examples/chat_tiny_server.py",
        "examples/agents/weather.yaml",
        "examples/agents/README.md",
    } <= set(shown)
    for source, commands in shown.items():
        for command in commands:
            assert command in allowed, f"{source} shows {command!r}, which the README's Examples block lacks"


def demo_commands() -> list[str]:
    """scripts/demo.sh's command lines, in the README's spelling."""
    out = []
    for line in (REPO / "scripts" / "demo.sh").read_text().splitlines():
        line = line.strip()
        if line.startswith("serve_bg "):
            line = line[len("serve_bg ") :] + " &"
        elif line == "stop_server":
            line = "kill %1"
        elif not line.startswith(("sglang-ds41 ", "python examples/")):
            continue
        out.append(line.replace("$PORT", "30000").replace("$TMPD/", "/tmp/"))
    return out


def test_demo_runs_exactly_the_readme_examples():
    assert demo_commands() == readme_examples()


def test_the_examples_block_has_the_expected_segments():
    servers = [server for server, _ in segments(readme_examples())]
    assert servers == [None, "sglang-ds41 serve --tiny --port 30000", None]


# ---- checks of each command's output ---------------------------------------------------------


def check(result, session: Session) -> None:
    """What each example must print, beyond exiting 0."""
    cmd, out = result.command, result.stdout
    assert result.returncode == 0, (
        f"{cmd!r} exited {result.returncode}:\n{result.stdout}\n{result.stderr[-3000:]}"
    )
    if cmd.startswith("sglang-ds41 render"):
        assert out.encode() == (EXAMPLES / "example.txt").read_bytes()
    elif cmd.startswith("sglang-ds41 parse"):
        message = json.loads(out)["message"]
        assert len(message["tool_calls"]) == 2 and message["reasoning_content"]
    elif "chat_tiny_server.py" in cmd:
        assert "server == reference, token for token: True" in out
    elif "vision_tiny_server.py" in cmd:
        assert "server == reference, token for token: True" in out and ": False" not in out
    elif "--scripted" in cmd:  # the in-process scripted server plays the intended run
        check_scripted_run(cmd, out, session)
    else:  # the served tiny model's own run
        check_model_run(result, session)


def check_scripted_run(cmd: str, out: str, session: Session) -> None:
    if "weather_calculator.py" in cmd:
        assert "(3 steps, 3 tool calls" in out
    elif "file_workspace.py" in cmd:
        summary = session.scratch / "ds41-workspace" / "SUMMARY.md"
        assert summary.read_text() == "# Summary\n\nNotes collected.\n"
    elif "extract_invoice.py" in cmd:
        printed = json.loads(out[: out.rindex("}") + 1])
        assert printed["currency"] == "EUR" and printed["total"] == 13.5
    else:
        raise AssertionError(f"no output check for {cmd!r}: add one")


def check_model_run(result, session: Session) -> None:
    """What the trained model does is its own (docs/TRAINING.md measures how well); what must
    hold is the runner's contract around it: progress and answer where the README says, a
    resumed finished run giving the same answer, a structured answer that validates."""
    cmd, out, err = result.command, result.stdout, result.stderr
    done = re.search(r"\[done\] \d+ steps, \d+ tool calls", err)
    if cmd.startswith("sglang-ds41 agent") and "--stream" in cmd:
        assert "[step 1] waiting for the model" in err and "[thinking] " in err and done
    elif cmd.startswith("sglang-ds41 agent") and "--resume" in cmd:
        [logged] = [r for r in session.results if "--run-dir" in r.command]
        assert out == logged.stdout and out.strip()  # the finished run's answer, not a new run
    elif cmd.startswith("sglang-ds41 agent"):
        # greedy (the shipped generation_config): the same run as the streamed one, whose
        # content went to stdout as it came and whose reasoning went to stderr only
        [streamed] = [r for r in session.results if "--stream" in r.command]
        assert out.strip() and done and out.strip() == streamed.stdout.strip()
    elif "weather_calculator.py" in cmd:
        lines = out.rstrip("\n").splitlines()
        transcript = [json.loads(line) for line in lines if line.startswith('{"role": ')]
        assert {"role": "user", "content": EXAMPLE_QUESTION} in transcript[:2]  # after the instructions
        assert transcript[-1]["role"] == "assistant"  # then the answer: its content, as printed
        assert "\n".join(lines[len(transcript) : -1]) == transcript[-1]["content"]
        assert re.fullmatch(r"\(\d+ steps, \d+ tool calls, \d+ tokens\)", lines[-1])
    elif "file_workspace.py" in cmd:
        assert out.strip()  # whatever it wrote stays inside the workspace (the cwd stays empty)
    elif "extract_invoice.py" in cmd:
        printed = json.loads(out[: out.rindex("}") + 1])
        example = load_example("extract_invoice")
        example.Invoice.model_validate(printed)
    else:
        raise AssertionError(f"no output check for {cmd!r}: add one")


def run_segment(session: Session, server: str | None, commands: list[str]) -> None:
    if server is not None:
        session.start(server)
        ready = [line for line in session.server_output().splitlines() if "ready after" in line]
        assert ready and re.search(
            rf"DeepSeek-V4\.1-Flash \(.*\) at http://127\.0\.0\.1:{session.port}/v1$", ready[0]
        )
    try:
        for command in commands:
            check(session.run(command), session)
    finally:
        if server is not None:
            assert session.stop() == 0, f"{server!r} did not stop cleanly:\n{session.server_output()}"


@pytest.fixture
def session(tmp_path) -> Session:
    (tmp_path / "cwd").mkdir()
    return Session(bin_dir=BIN, cwd=tmp_path / "cwd", scratch=tmp_path, port=free_port())


def test_the_examples_without_a_server_run_as_written_from_another_directory(session):
    offline = [cmds for server, cmds in segments(readme_examples()) if server is None]
    for commands in offline:
        run_segment(session, None, commands)
    assert len(session.results) == 5


@pytest.mark.integration
def test_the_examples_run_as_written_against_the_tiny_sglang_server(session):
    [(server, commands)] = [s for s in segments(readme_examples()) if s[0] and "--tiny" in s[0]]
    run_segment(session, server, commands)
    assert len(session.results) == 8
    assert session.cwd.exists() and not any(session.cwd.iterdir())  # nothing written to the cwd


def test_a_base_url_without_v1_is_refused_with_the_convention():
    run = Session(bin_dir=BIN, cwd=REPO, scratch=REPO, port=9)  # argument check only: no server
    result = run.run("python examples/chat_tiny_server.py --base-url http://127.0.0.1:9")
    assert result.returncode != 0 and "ending in /v1" in result.stderr
