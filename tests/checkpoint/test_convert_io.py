"""The conversion's machinery: the overlapped read/work/write loop, the kernel copy, and the
compiled re-encoder's fallback where numba cannot keep a cache."""

from __future__ import annotations

import os
import random
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from sglang_ds41.checkpoint.convert.write import overlapped
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
        overlapped(chunks, self.read, self.work, self.write, self.finished)


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


COMPILED_WITHOUT_A_CACHE = """
import importlib.util, sys
import numba
from sglang_ds41.fast.jit import compiled
spec = importlib.util.spec_from_file_location("kernel", sys.argv[1])
module = importlib.util.module_from_spec(spec)
spec.loader.exec_module(module)
decorate = compiled if sys.argv[2] == "compiled" else numba.njit(cache=True)
print(decorate(module.add_one)(41))
"""


def test_the_compiled_loop_works_where_numba_cannot_write_a_cache(tmp_path: Path):
    """A read-only install with no writable home: numba refuses `cache=True` at decoration;
    `compiled` then compiles without one. (Both of numba's cache places are made unusable: a
    file where the source's __pycache__ would go, NUMBA_CACHE_DIR and the home below a file.)"""
    (tmp_path / "kernel.py").write_text("def add_one(x):\n    return x + 1\n")
    (tmp_path / "__pycache__").write_text("not a directory")
    below_a_file = str(tmp_path / "__pycache__" / "x")
    env = {**os.environ, **dict.fromkeys(("NUMBA_CACHE_DIR", "HOME", "XDG_CACHE_HOME"), below_a_file)}

    def run(mode: str) -> subprocess.CompletedProcess:
        argv = [sys.executable, "-c", COMPILED_WITHOUT_A_CACHE, str(tmp_path / "kernel.py"), mode]
        return subprocess.run(argv, capture_output=True, text=True, env=env, timeout=120)

    plain = run("plain")  # what `compiled` guards against
    assert plain.returncode != 0 and "no locator available" in plain.stderr, plain.stderr[-2000:]
    done = run("compiled")
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "42"
