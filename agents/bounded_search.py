"""ECMA-262 pattern searches with a time limit, run by regress in a child process.

Why: ECMA-262 matching backtracks, so a pattern with nested or overlapping quantifiers takes
exponential time on a near-miss: `^(a+)+$` against 28 "a"s and a "!" takes ~9 s, and each further
character doubles it. The schema (and its pattern) is the developer's, but the string is the
model's, so a model could stall validation for days; and regress holds the interpreter lock
while it matches, so nothing in the process (a timeout, the event loop) would run meanwhile. In
a child process the search can be given up and killed. `search` answers True or False, or raises
`TooSlow` after `TIMEOUT_S`; the child is then replaced on the next call.
"""

from __future__ import annotations

import atexit
import json
import os
import select
import subprocess
import sys
import threading

TIMEOUT_S = 2.0
CACHED_PATTERNS = 256

_CHILD = f"""
import json, sys
import regress
compiled = {{}}
for line in sys.stdin:
    pattern, text = json.loads(line)
    regex = compiled.get(pattern)
    if regex is None:
        if len(compiled) >= {CACHED_PATTERNS}:
            compiled.clear()
        regex = compiled[pattern] = regress.Regex(pattern, sys.argv[1])
    sys.stdout.write("1\\n" if regex.find(text) is not None else "0\\n")
    sys.stdout.flush()
"""


class TooSlow(Exception):
    """A search that ran past TIMEOUT_S and was stopped."""


class _Child:
    """One child process per Python process (a forked process starts its own), used one search
    at a time."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._process: subprocess.Popen[str] | None = None
        self._owner = 0
        atexit.register(self._stop)

    def search(self, pattern: str, text: str, flags: str, timeout_s: float) -> bool:
        with self._lock:
            process = self._running(flags)
            try:
                assert process.stdin is not None and process.stdout is not None
                process.stdin.write(json.dumps([pattern, text]) + "\n")
                process.stdin.flush()
                ready, _, _ = select.select([process.stdout], [], [], timeout_s)
                answer = process.stdout.readline() if ready else None
            except OSError:
                answer = ""
            if answer is None:
                self._stop()
                raise TooSlow(f"the pattern took longer than {timeout_s:g} s on {len(text):,} characters")
            if answer not in ("1\n", "0\n"):
                self._stop()
                raise RuntimeError(f"the pattern search process ended unexpectedly on {pattern!r}")
            return answer == "1\n"

    def _running(self, flags: str) -> subprocess.Popen[str]:
        if self._process is None or self._owner != os.getpid() or self._process.poll() is not None:
            if self._owner == os.getpid():
                self._stop()
            self._process = subprocess.Popen(
                [sys.executable, "-I", "-c", _CHILD, flags],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.DEVNULL,
                text=True,
                encoding="utf-8",
            )
            self._owner = os.getpid()
        return self._process

    def _stop(self) -> None:
        process, self._process = self._process, None
        if process is None or self._owner != os.getpid():
            return
        process.kill()
        process.wait()
        for stream in (process.stdin, process.stdout):
            if stream is not None:
                stream.close()


_child = _Child()


def search(pattern: str, text: str, flags: str) -> bool:
    """Whether `pattern` (which must compile with `flags`) matches anywhere in `text`, a string
    UTF-8 can encode; raises `TooSlow` past TIMEOUT_S."""
    return _child.search(pattern, text, flags, TIMEOUT_S)
