"""ECMA-262 pattern searches with a time limit, run by regress in a child process (POSIX).

Why: ECMA-262 matching backtracks, so a pattern with nested or overlapping quantifiers takes
exponential time on a near-miss: `^(a+)+$` against 28 "a"s and a "!" takes ~9 s, and each further
character doubles it. The schema (and its pattern) is the developer's, but the string is the
model's, so a model could stall validation for days; and regress holds the interpreter lock
while it matches, so nothing in the process (a timeout, the event loop) would run meanwhile. In
a child process (`_regex_child.py`) the search can be given up and killed. `search` answers
True or False, or raises `Uncheckable` (`TooSlow` after `TIMEOUT_S`); the child is replaced on
the next call. A search costs a pipe round trip (~20-35 us); the child starts once (~30 ms).
"""

from __future__ import annotations

import atexit
import json
import os
import select
import subprocess
import sys
import threading
from pathlib import Path
from typing import IO

import regress

TIMEOUT_S = 2.0  # read at each call
START_TIMEOUT_S = 30.0
CHILD = Path(__file__).with_name("_regex_child.py")


class Uncheckable(Exception):
    """A text whose match could not be decided; validation reports it as the one problem."""


class TooSlow(Uncheckable):
    """A search that ran past TIMEOUT_S and was stopped."""


class _Child:
    """One child process per Python process, used one search at a time. A forked process starts
    its own: the parent's pipes are left alone (closing them could flush into the parent's
    child) and the lock is new (another thread may have held it at the fork)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._process: subprocess.Popen[str] | None = None
        self._inherited: list[subprocess.Popen[str]] = []  # kept open, never used
        atexit.register(self._stop)
        os.register_at_fork(after_in_child=self._forget)

    def search(self, pattern: str, flags: str, text: str, timeout_s: float) -> bool:
        request = json.dumps([pattern, flags, text, timeout_s]) + "\n"
        with self._lock:
            for attempt in (1, 2):  # a child found dead at the write is replaced once
                process = self._running()
                try:
                    _write(process, request)
                except BrokenPipeError:
                    self._stop()
                    if attempt == 2:
                        raise Uncheckable("the pattern search process does not accept requests") from None
                    continue
                except BaseException:
                    self._stop()
                    raise
                break
            try:
                answer = _readline(process.stdout, timeout_s)
            except BaseException:  # interrupted: its answer must not be read as the next one's
                self._stop()
                raise
            if answer is None:
                self._stop()
                raise TooSlow(f"the pattern took longer than {timeout_s:g} s on {len(text):,} characters")
            if answer not in ("1\n", "0\n"):
                reason = self._stop()
                raise Uncheckable(f"the pattern search process failed ({reason})")
            return answer == "1\n"

    def _running(self) -> subprocess.Popen[str]:
        if self._process is not None and self._process.poll() is None:
            return self._process
        self._stop()
        site = str(Path(regress.__file__).resolve().parents[1])
        process = subprocess.Popen(
            [sys.executable, "-I", str(CHILD), site],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            encoding="utf-8",
        )
        self._process = process
        if _readline(process.stdout, START_TIMEOUT_S) != "ready\n":
            reason = self._stop()
            raise Uncheckable(f"the pattern search process did not start ({reason})")
        return process

    def _stop(self) -> str:
        """Kill the child; what it wrote to stderr, last line first, or its exit status."""
        process, self._process = self._process, None
        if process is None:
            return "not running"
        process.kill()
        status = process.wait()
        assert process.stderr is not None
        errors = process.stderr.read().strip().splitlines()
        for stream in (process.stdin, process.stdout, process.stderr):
            if stream is not None:
                stream.close()
        return errors[-1][:300] if errors else f"exit status {status}"

    def _forget(self) -> None:
        if self._process is not None:
            self._inherited.append(self._process)
        self._process = None
        self._lock = threading.Lock()


def _write(process: subprocess.Popen[str], request: str) -> None:
    assert process.stdin is not None
    process.stdin.write(request)
    process.stdin.flush()


def _readline(stream: IO[str] | None, timeout_s: float) -> str | None:
    """A line from the child, "" if it closed its output, None if none came within the time
    (`poll`, not `select`, which refuses descriptors past 1,023)."""
    assert stream is not None
    poller = select.poll()
    poller.register(stream.fileno(), select.POLLIN)
    if not poller.poll(max(0, int(timeout_s * 1000))):
        return None
    return stream.readline()


_child = _Child()


def search(pattern: str, text: str, flags: str) -> bool:
    """Whether `pattern` (which must compile with `flags`) matches anywhere in `text`, a string
    UTF-8 can encode; raises `Uncheckable` if that cannot be decided within TIMEOUT_S."""
    return _child.search(pattern, flags, text, TIMEOUT_S)
