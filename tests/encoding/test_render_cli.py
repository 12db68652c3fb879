"""`sglang-ds41 render` prints the official renderer's exact bytes (no added newline)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.encoding.oracle import wheel

REQUEST = (
    '{"model": "DeepSeek-V4.1-Flash", "messages": [{"role": "user", "content": "héllo <｜User｜>"}],'
    ' "tools": [{"type": "function", "function": {"name": "f", "parameters":'
    ' {"type": "object", "x": 1.50, "y": 1e3}}}], "thinking": {"type": "disabled"}}'
)


def run_cli(*args: str, stdin: bytes | None = None) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(
        [sys.executable, "-m", "sglang_ds41", "render", *args],
        input=stdin,
        capture_output=True,
        timeout=120,
    )


def test_render_prints_the_official_prompt_bytes(tmp_path: Path) -> None:
    path = tmp_path / "request.json"
    path.write_text(REQUEST, encoding="utf-8")
    done = run_cli(str(path))
    assert done.returncode == 0, done.stderr
    assert done.stdout == wheel(REQUEST, ids=False).prompt.encode("utf-8")


def test_render_reads_stdin_and_prints_token_ids() -> None:
    done = run_cli("--tokens", "-", stdin=REQUEST.encode())
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == list(wheel(REQUEST).ids)


def test_rejected_request_exits_non_zero_with_a_message() -> None:
    done = run_cli("-", stdin=b'{"model": "DeepSeek-V4.1-Flash", "messages": []}')
    assert done.returncode == 2
    assert b"Empty input messages" in done.stderr and b"Traceback" not in done.stderr


def test_invalid_json_and_missing_file_are_clear_errors(tmp_path: Path) -> None:
    bad = run_cli("-", stdin=b"{not json")
    assert bad.returncode == 2 and b"invalid request body" in bad.stderr
    missing = run_cli(str(tmp_path / "absent.json"))
    assert missing.returncode == 2 and b"cannot read request file" in missing.stderr
