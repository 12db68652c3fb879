"""Writing the output: each shard as ``*.partial``, the untouched tensors copied by the kernel, the
tables' rows re-encoded on their way out with the disk and the CPU busy at once, then renamed."""

from __future__ import annotations

import os
import shutil
import struct
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import numpy as np

from sglang_ds41.checkpoint.convert.journal import kill_point
from sglang_ds41.checkpoint.convert.plan import Job, Plan, Shard, Table
from sglang_ds41.checkpoint.convert.quality import Quality
from sglang_ds41.checkpoint.convert.report import gb
from sglang_ds41.checkpoint.convert.rows import encode, measure
from sglang_ds41.checkpoint.convert.source import Sources
from sglang_ds41.checkpoint.st_writer import (
    PARTIAL_SUFFIX,
    OutputError,
    PartialFile,
    PWrite,
    describe_os_error,
    free_bytes,
    write_bytes_atomic,
)
from sglang_ds41.formats.engram import NVFP4

COPY_CHUNK = 16 << 20
C, D, R = TypeVar("C"), TypeVar("D"), TypeVar("R")


@dataclass
class Progress:
    bar: Any
    rows: int = 0
    convert_seconds: float = 0.0

    def advance(self, nbytes: int, rows: int = 0, seconds: float = 0.0) -> None:
        self.rows += rows
        self.convert_seconds += seconds
        if self.bar is not None:
            if rows:
                self.bar.set_postfix_str(
                    f"{self.rows / max(self.convert_seconds, 1e-9):,.0f} rows/s", refresh=False
                )
            self.bar.update(nbytes)


@dataclass(frozen=True)
class _Recoded:
    """A chunk's re-encoded rows, per output tensor stored in this shard; their quality when
    this shard is the one that measures the table (the one holding its weight)."""

    parts: dict[Job, np.ndarray]
    seconds: float
    quality: Quality | None


def overlapped(
    chunks: Sequence[C],
    read: Callable[[C], D],
    work: Callable[[C, D], R],
    write: Callable[[C, R], None],
    done: Callable[[C, R], None],
) -> None:
    """read -> work -> write every chunk, in order, with the disk and the CPU busy at once.

    The read of chunk i+1 and the write of chunk i-1 run on two I/O threads while this thread
    works on chunk i (pread/pwrite and the compiled re-encoder release the GIL).
    At most three chunks are alive, so memory stays bounded. `done` runs here, in order, once a
    chunk's write returned; the first error is raised after in-flight I/O has settled, so the
    caller never closes or removes a file under a running write."""
    if not chunks:
        return
    with ThreadPoolExecutor(2, thread_name_prefix="convert-io") as io:
        reading = io.submit(read, chunks[0])
        writing: tuple[Future[None], C, R] | None = None
        for i, chunk in enumerate(chunks):
            data = reading.result()
            if i + 1 < len(chunks):
                reading = io.submit(read, chunks[i + 1])
            result = work(chunk, data)
            if writing is not None:
                writing[0].result()
                done(writing[1], writing[2])
            writing = (io.submit(write, chunk, result), chunk, result)
        assert writing is not None
        writing[0].result()
        done(writing[1], writing[2])


def write_shard(
    plan: Plan,
    shard: Shard,
    sources: Sources,
    chunk_rows: int,
    pwrite: PWrite,
    progress: Progress,
    after: int,
    workers: int,
) -> dict[int, Quality]:
    """Write one output shard: its header, copies of the untouched tensors, the re-encoded rows.
    Returns the quality of the tables it measured (those whose weight it holds)."""
    where = {j.name: off for j, off in zip(shard.jobs, shard.offsets, strict=True)}
    with PartialFile(plan.dst / shard.file, shard.size, pwrite, needed_after=after) as out:
        out.write_at(0, shard.header)
        progress.advance(len(shard.header))
        buf = None
        for job in shard.jobs:
            if job.table is not None:
                continue
            for pos in range(0, job.nbytes, COPY_CHUNK):
                n = min(COPY_CHUNK, job.nbytes - pos)
                src, dst = job.source.start + pos, where[job.name] + pos
                done = out.copy_from(sources.fd(job.source.file), src, dst, n)
                if done < n:  # no kernel copy here: through a buffer
                    buf = buf if buf is not None else bytearray(COPY_CHUNK)
                    view = memoryview(buf)[: n - done]
                    sources.read_into(job.source.file, src + done, view)
                    out.write_at(dst + done, view)
                progress.advance(n)
                kill_point("chunk")

        # Engram tables: row chunks, re-encoded here (over `workers` threads) on their way out.
        rows_chunks = [
            (table, start, min(start + chunk_rows, table.rows))
            for table in shard.tables
            for start in range(0, table.rows, chunk_rows)
        ]
        # A table's weight and scale may sit in different shards: each shard writes its own part.
        parts = {(j.table.layer, j.part): j for j in shard.jobs if j.table is not None}
        quality: dict[int, Quality] = {}
        for (layer, part), job in parts.items():
            if part == plan.target.values.name:
                quality[layer] = Quality()
            if part == NVFP4.global_scale.name:  # NVFP4's one float32 per table
                out.write_at(where[job.name], struct.pack("<f", job.table.global_scale))

        def read_rows(chunk: tuple[Table, int, int]) -> tuple[np.ndarray, np.ndarray]:
            return sources.rows(*chunk)

        def recode_rows(chunk: tuple[Table, int, int], rows: tuple[np.ndarray, np.ndarray]) -> _Recoded:
            begin = time.perf_counter()
            table = chunk[0]
            encoded = encode(plan, table, rows, workers)
            measured = measure(plan, table, rows, encoded, workers) if table.layer in quality else None
            out_parts = dict(zip(plan.output_parts, map(np.ascontiguousarray, encoded), strict=True))
            kept = {parts[table.layer, p]: data for p, data in out_parts.items() if (table.layer, p) in parts}
            return _Recoded(kept, time.perf_counter() - begin, measured)

        def write_rows(chunk: tuple[Table, int, int], recoded: _Recoded) -> None:
            table, start, _ = chunk
            for job, data in recoded.parts.items():
                out.write_at(where[job.name] + start * (job.nbytes // table.rows), data.data)

        def wrote_rows(chunk: tuple[Table, int, int], recoded: _Recoded) -> None:
            if recoded.quality is not None:
                quality[chunk[0].layer] = quality[chunk[0].layer].merge(recoded.quality)
            progress.advance(
                sum(d.nbytes for d in recoded.parts.values()), chunk[2] - chunk[1], recoded.seconds
            )
            kill_point("chunk")

        overlapped(rows_chunks, read_rows, recode_rows, write_rows, wrote_rows)
        out.commit()
    kill_point("commit")
    return quality


def copy_other(plan: Plan, name: str, pwrite: PWrite) -> None:
    src, final = plan.src / name, plan.dst / name
    if src.is_dir():
        tmp = final.with_name(name + PARTIAL_SUFFIX)
        shutil.rmtree(tmp, ignore_errors=True)
        try:
            shutil.copytree(src, tmp)
            if final.exists():
                shutil.rmtree(final)
            os.replace(tmp, final)
        except OSError as error:
            shutil.rmtree(tmp, ignore_errors=True)
            raise OutputError(describe_os_error(error, final)) from None
        return
    if src.stat().st_size <= COPY_CHUNK:
        write_bytes_atomic(final, src.read_bytes(), pwrite)
        return
    with PartialFile(final, src.stat().st_size, pwrite) as out, open(src, "rb") as f:
        buf = bytearray(COPY_CHUNK)
        pos = 0
        while n := f.readinto(buf):
            out.write_at(pos, memoryview(buf)[:n])
            pos += n
        out.commit()


def remove_partials(dst: Path) -> None:
    for p in dst.iterdir():
        if p.name.endswith(PARTIAL_SUFFIX):
            shutil.rmtree(p) if p.is_dir() else p.unlink()


def require_space(plan: Plan, todo: list[Shard]) -> None:
    needed = sum(s.size for s in todo) + sum(
        (plan.src / n).stat().st_size for n in plan.other_files if (plan.src / n).is_file()
    )
    free = free_bytes(plan.dst)
    if 0 <= free < needed:
        raise OutputError(
            f"not enough space on {plan.dst}: the conversion still needs {needed:,} bytes "
            f"({gb(needed)}; {len(todo)} shard(s) + other files), {free:,} bytes are free"
        )
