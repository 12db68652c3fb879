"""The conversion's I/O pieces: the overlapped read/work/write loop and the kernel copy."""

from __future__ import annotations

import os
import random
import threading
import time
from pathlib import Path

import pytest

from sglang_ds41.checkpoint.convert_engram import _overlapped
from sglang_ds41.checkpoint.st_writer import PartialFile


class _Recorder:
    """read/work/write/done callables that sleep at random and record what ran when."""

    def __init__(self, fail: tuple[str, int] | None = None, seed: int = 0):
        self.rng = random.Random(seed)
        self.lock = threading.Lock()
        self.fail = fail
        self.active = 0  # read/write calls running right now
        self.alive: set[int] = set()  # chunks read but not yet done
        self.max_alive = 0
        self.writes: list[tuple[int, str]] = []
        self.done: list[int] = []

    def _io(self, kind: str, chunk: int) -> None:
        with self.lock:
            self.active += 1
        try:
            time.sleep(self.rng.random() * 0.003)
            if self.fail == (kind, chunk):
                raise OSError(f"{kind} {chunk} failed")
        finally:
            with self.lock:
                self.active -= 1

    def read(self, chunk: int) -> str:
        self._io("read", chunk)
        with self.lock:
            self.alive.add(chunk)
            self.max_alive = max(self.max_alive, len(self.alive))
        return f"data{chunk}"

    def work(self, chunk: int, data: str) -> str:
        time.sleep(self.rng.random() * 0.003)
        return data.upper()

    def write(self, chunk: int, result: str) -> None:
        self._io("write", chunk)
        self.writes.append((chunk, result))

    def finished(self, chunk: int, result: str) -> None:
        assert self.active <= 1  # at most the next read runs beside this thread
        self.done.append(chunk)
        self.alive.discard(chunk)

    def run(self, chunks: list[int]) -> None:
        _overlapped(chunks, self.read, self.work, self.write, self.finished)


@pytest.mark.parametrize("seed", range(5))
def test_every_chunk_is_read_worked_and_written_once_in_order(seed):
    rec = _Recorder(seed=seed)
    rec.run(list(range(40)))
    assert rec.writes == [(i, f"DATA{i}") for i in range(40)]
    assert rec.done == list(range(40))
    assert rec.max_alive <= 3  # the chunk being read, worked on, and written: bounded memory


@pytest.mark.parametrize("fail", [("read", 0), ("read", 5), ("write", 0), ("write", 5), ("write", 39)])
def test_the_first_failure_is_raised_after_in_flight_io_settled(fail):
    rec = _Recorder(fail=fail)
    with pytest.raises(OSError, match=f"{fail[0]} {fail[1]} failed"):
        rec.run(list(range(40)))
    assert rec.active == 0  # nothing still writes into a file the caller is about to remove
    assert rec.done == list(range(rec.done[-1] + 1 if rec.done else 0))
    assert all(chunk < fail[1] for chunk in rec.done)
    assert len(rec.writes) <= fail[1] + (fail[0] == "read")


def test_no_chunks_do_nothing():
    rec = _Recorder()
    rec.run([])
    assert rec.writes == [] and rec.done == []


def test_kernel_copy_lands_at_the_offsets_and_declines_what_it_cannot_copy(tmp_path: Path):
    src = tmp_path / "src"
    src.write_bytes(bytes(range(256)) * 64)
    out = PartialFile(tmp_path / "dst", 100)
    fd = os.open(src, os.O_RDONLY)
    try:
        assert out.copy_from(fd, 1000, 10, 50) == 50
        assert out.copy_from(fd, len(src.read_bytes()) - 5, 60, 40) == 5  # the source ends early
        r, w = os.pipe()
        os.write(w, b"x" * 40)
        assert out.copy_from(r, 0, 60, 40) == 0  # no kernel copy from a pipe: the caller writes
        os.close(r), os.close(w)
        out.write_at(0, b"h" * 10)
        out.write_at(65, b"t" * 35)
        out.commit()
    finally:
        os.close(fd)
    data = (tmp_path / "dst").read_bytes()
    assert data == b"h" * 10 + src.read_bytes()[1000:1050] + src.read_bytes()[-5:] + b"t" * 35
