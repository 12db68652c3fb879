"""The commands the README and the example files show, and a runner that runs them as written.

Documented commands are the lines of the README's and examples/agents/README.md's ```bash
blocks, the usage lines of the example scripts' docstrings (indented four spaces) and the
commented command lines of the example specs. The README's Examples block is the one they all
come from; `Session` runs its lines from a directory outside the repository, with only these
mechanical substitutions: `python` / `sglang-ds41` are the given environment's, repository paths
(`examples/...`) are made absolute, port 30000 becomes a free port and `/tmp/ds41-*` a scratch
directory. A line ending in ` &` starts a server (waited for until it prints its ready line),
`kill %1` stops it.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import re
import shlex
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
README = REPO / "README.md"
EXAMPLES = REPO / "examples"
PORT = "30000"
READY = "ready after"


def load_example(name: str):
    """examples/agents/NAME.py as a module (its `agent`, `scripted()`, types and constants)."""
    spec = importlib.util.spec_from_file_location(f"example_{name}", EXAMPLES / "agents" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # pydantic resolves the example's annotations through it
    spec.loader.exec_module(module)
    return module


def bash_blocks(text: str) -> list[list[str]]:
    """The command lines of each ```bash block (comments and blank lines dropped, `\\` joined)."""
    blocks, current, inside = [], [], False
    for line in text.splitlines():
        if line.startswith("```"):
            if inside:
                blocks.append(current)
            current, inside = [], line.strip() == "```bash"
            continue
        if inside:
            current.append(line)
    out = []
    for block in blocks:
        joined = "\n".join(block).replace("\\\n", " ")
        out.append([normal(line) for line in joined.splitlines() if normal(line)])
    return out


def normal(line: str) -> str:
    """A command line without its trailing `# comment` and with single spaces."""
    line = line.strip()
    if line.startswith("#"):
        return ""
    line = re.split(r"\s+#\s", line, maxsplit=1)[0]
    return " ".join(line.split())


def readme_examples() -> list[str]:
    """The README's Examples block: the one list every example command comes from."""
    text = README.read_text(encoding="utf-8")
    section = text[text.index("\n## Examples\n") :]
    section = section[: section.index("\n## ", 1)]
    [block] = bash_blocks(section)
    return block


def example_file_commands() -> dict[str, list[str]]:
    """Commands shown in example files: docstring usage lines, spec comments, README blocks."""
    found: dict[str, list[str]] = {}
    for path in sorted(EXAMPLES.rglob("*")):
        rel = str(path.relative_to(REPO))
        if path.suffix == ".py":
            lines = [
                line[4:] for line in path.read_text(encoding="utf-8").splitlines() if line.startswith("    ")
            ]
            cmds = [normal(line) for line in lines if line.startswith(("python ", "sglang-ds41 "))]
        elif path.suffix in (".yaml", ".yml"):
            lines = [line.lstrip("#").strip() for line in path.read_text(encoding="utf-8").splitlines()]
            cmds = [normal(line) for line in lines if line.startswith(("python ", "sglang-ds41 "))]
        elif path.suffix == ".md":
            cmds = [c for block in bash_blocks(path.read_text(encoding="utf-8")) for c in block]
        else:
            continue
        if cmds:
            found[rel] = cmds
    return found


def segments(block: list[str]) -> list[tuple[str | None, list[str]]]:
    """The Examples block as (server command or None, the commands run while it serves)."""
    out: list[tuple[str | None, list[str]]] = [(None, [])]
    for line in block:
        if line.endswith(" &"):
            out.append((line[:-2], []))
        elif line == "kill %1":
            out.append((None, []))
        else:
            out[-1][1].append(line)
    return [(server, cmds) for server, cmds in out if server or cmds]


@dataclass
class Result:
    command: str
    returncode: int
    stdout: str
    stderr: str
    seconds: float


@dataclass
class Session:
    """Runs documented command lines with `bin_dir`'s python and sglang-ds41, from `cwd`."""

    bin_dir: Path
    cwd: Path
    scratch: Path
    port: int
    env: dict[str, str] = field(default_factory=dict)
    server: subprocess.Popen | None = None
    server_out: Path | None = None
    results: list[Result] = field(default_factory=list)

    def argv(self, line: str) -> list[str]:
        words = shlex.split(line)
        if words[0] in ("python", "sglang-ds41"):
            words[0] = str(self.bin_dir / words[0])
        out = []
        for word in words:
            word = word.replace(f":{PORT}", f":{self.port}")
            word = str(self.port) if word == PORT else word
            if word.startswith("/tmp/ds41-"):
                word = str(self.scratch / word[len("/tmp/") :])
            if word.startswith(("examples/", "scripts/")):
                word = str(REPO / word)
            out.append(word)
        return out

    def environ(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
        env["PATH"] = f"{self.bin_dir}{os.pathsep}{env.get('PATH', '')}"
        return {**env, **self.env}

    def run(self, line: str, timeout_s: float = 900) -> Result:
        t0 = time.monotonic()
        proc = subprocess.run(
            self.argv(line),
            cwd=self.cwd,
            env=self.environ(),
            capture_output=True,
            text=True,
            timeout=timeout_s,
        )
        result = Result(line, proc.returncode, proc.stdout, proc.stderr, time.monotonic() - t0)
        self.results.append(result)
        return result

    def start(self, line: str, timeout_s: float = 900) -> float:
        """`line &`: start the server, wait for its ready line; returns the seconds it took."""
        assert self.server is None, "one server at a time"
        self.server_out = self.scratch / f"server-{len(self.results)}.out"
        t0 = time.monotonic()
        with open(self.server_out, "w") as out:
            self.server = subprocess.Popen(
                self.argv(line), cwd=self.cwd, env=self.environ(), stdout=out, stderr=subprocess.STDOUT,
                start_new_session=True,
            )  # fmt: skip
        while READY not in self.server_output():
            if self.server.poll() is not None:
                raise AssertionError(
                    f"{line!r} exited with {self.server.returncode}:\n{self.server_output()}"
                )
            if time.monotonic() - t0 > timeout_s:
                self.stop()
                raise AssertionError(f"{line!r} not ready after {timeout_s:.0f} s:\n{self.server_output()}")
            time.sleep(0.5)
        return time.monotonic() - t0

    def server_output(self) -> str:
        return self.server_out.read_text(errors="replace") if self.server_out else ""

    def stop(self) -> int | None:
        """`kill %1`: SIGTERM to serve (which stops SGLang), SIGKILL to its session if it lingers."""
        if self.server is None:
            return None
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.server.pid, signal.SIGTERM)
        try:
            code = self.server.wait(60)
        except subprocess.TimeoutExpired:
            code = None
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.server.pid, signal.SIGKILL)
        self.server.wait(10)
        self.server = None
        return code
