"""The append-only JSONL event log of a run: one event per line, durable before the run acts on it.

Each event is written (to the OS) as it happens, so a SIGKILL loses nothing. Durability against
an OS crash (fsync) is grouped: the runner calls `sync()` before anything leaves the process (a
tool runs, a model request is sent) and the log syncs when closed, so every event that an action
depends on is on disk before the action; one step costs two fsyncs instead of one per event.
After a crash the log holds every completed step. A kill can tear only the last line; `read_log`
drops it and `EventLog` truncates it away before appending. A bad line anywhere else means the
file was damaged or edited, and resuming refuses it.

Test hook: with `SGLANG_DS41_AGENT_KILL_AFTER_EVENT=N` in the environment, the process SIGKILLs
itself right after event number N is written (used to test resume at every event boundary).
"""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

from .errors import RunLogError
from .events import Event

LOG_NAME = "events.jsonl"
KILL_ENV = "SGLANG_DS41_AGENT_KILL_AFTER_EVENT"


def log_path(run_dir: str | os.PathLike[str]) -> Path:
    return Path(run_dir) / LOG_NAME


def read_log(run_dir: str | os.PathLike[str]) -> list[Event]:
    """The events of a run, minus a torn last line."""
    path = log_path(run_dir)
    if not path.is_file():
        raise RunLogError(f"no event log at {path} (expected a run directory written by the agent runner)")
    return _parse(path.read_bytes(), path)[0]


def _parse(data: bytes, path: Path) -> tuple[list[Event], int]:
    """(events, byte length of the intact prefix)."""
    events: list[Event] = []
    good = 0
    lines = data.split(b"\n")
    for index, line in enumerate(lines):
        is_last = index == len(lines) - 1
        if is_last and not line:
            break
        try:
            if is_last:  # no newline after it: the write was cut
                raise ValueError("unterminated line")
            event = Event.from_json(json.loads(line))
        except (ValueError, KeyError, TypeError) as error:
            if is_last or (index == len(lines) - 2 and not lines[-1]):
                break  # a torn final write
            raise RunLogError(f"{path}: line {index + 1} is not a valid event ({error})") from None
        if event.seq != len(events) + 1:
            raise RunLogError(f"{path}: line {index + 1} has seq {event.seq}, expected {len(events) + 1}")
        events.append(event)
        good += len(line) + 1
    return events, good


class EventLog:
    """Appends events to `run_dir/events.jsonl`; `sync()` makes what was appended durable."""

    def __init__(self, run_dir: str | os.PathLike[str], *, resume: bool) -> None:
        self.run_dir = Path(run_dir)
        path = log_path(run_dir)
        if resume:
            self._count = len(self._repair(path))
        else:
            self.run_dir.mkdir(parents=True, exist_ok=True)
            if path.exists() and path.stat().st_size:
                raise RunLogError(f"{path} already holds a run; resume it or choose an empty run directory")
            self._count = 0
        self._file = open(path, "ab")  # noqa: SIM115 - kept open for the whole run
        self._dirty = False
        if not resume:
            _fsync_dir(self.run_dir)
        kill = os.environ.get(KILL_ENV)
        self._kill_after = int(kill) if kill else None

    @staticmethod
    def _repair(path: Path) -> list[Event]:
        if not path.is_file():
            raise RunLogError(
                f"no event log at {path} (expected a run directory written by the agent runner)"
            )
        data = path.read_bytes()
        events, good = _parse(data, path)
        if good < len(data):
            with open(path, "r+b") as handle:
                handle.truncate(good)
                os.fsync(handle.fileno())
        return events

    def append(self, event: Event) -> Event:
        stored = Event(event.type, {**event.data, "time": round(time.time(), 3)}, self._count + 1)
        # ASCII with escapes: every str round-trips, a lone surrogate too (which UTF-8 cannot
        # hold: Python makes them of bytes that are not UTF-8, e.g. in a listed file's name).
        line = json.dumps(stored.to_json(), separators=(",", ":")) + "\n"
        self._file.write(line.encode("ascii"))
        self._count += 1
        self._file.flush()  # in the OS from here on: a killed process loses nothing
        self._dirty = True
        if self._kill_after is not None and self._count == self._kill_after:
            os.kill(os.getpid(), signal.SIGKILL)
        return stored

    def sync(self) -> None:
        """fsync what was appended since the last sync (no-op when nothing was)."""
        if self._dirty:
            _datasync(self._file.fileno())
            self._dirty = False

    def close(self) -> None:
        if not self._file.closed:
            self.sync()
            self._file.close()


def _datasync(fd: int) -> None:
    # fdatasync still writes the file size an append changed; it skips only the mtime update.
    (getattr(os, "fdatasync", None) or os.fsync)(fd)


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
