"""`convert-engram`: re-encode a checkpoint's Engram tables FP8 -> MXFP4 (or back), streaming.

The official tables are 202 GB of FP8 (264 B/row); as MXFP4 (136 B/row) a TP=4 rank holds an
Engram table in 12.2 GiB instead of 23.6 GiB (MODEL.md §8.4, §9.2). Users convert the files they
downloaded, so the conversion must survive what a 500 GB job meets:

* bounded memory: source rows are read with ``pread`` (a memory map would keep every touched
  page resident, i.e. RSS = table size) in row chunks, at most three alive at a time; every
  other tensor is copied byte for byte by the kernel (``copy_file_range``), never through a
  float or through this process;
* near disk speed: the table rows are re-encoded by a compiled loop on all cores while the next
  chunk is read and the previous one written (`_overlapped`);
* atomic + resumable: each output file is written as ``*.partial``, fsync'd and renamed; the
  journal ``.convert-engram.json`` in DST records finished shards (and their sizes), so a rerun
  after a kill skips them and redoes the rest; config.json is written last;
* verified: the result is opened through the validating reader (tensor names, shapes, dtypes,
  sizes), compared with the source tensor by tensor, and sampled rows are decoded on both sides
  and checked against the definition (`formats`), with the error statistics reported.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import struct
import time
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import numpy as np

from sglang_ds41.checkpoint.engram_recode import default_workers, recode
from sglang_ds41.checkpoint.reader import CONFIG_FILE, INDEX_FILE, Checkpoint, StoredTensor
from sglang_ds41.checkpoint.st_writer import (
    PARTIAL_SUFFIX,
    HeaderEntry,
    OutputError,
    PartialFile,
    PWrite,
    build_header,
    canonical_order,
    describe_os_error,
    free_bytes,
    write_bytes_atomic,
)
from sglang_ds41.errors import Ds41Error

FORMATS = ("mxfp4", "fp8")
JOURNAL = ".convert-engram.json"
JOURNAL_KIND = "sglang-ds41 convert-engram journal v1"
MX_BLOCK = 32
DEFAULT_CHUNK_ROWS = 1 << 16  # ~17 MB of FP8 rows in, ~100 MB of transient arrays
COPY_CHUNK = 16 << 20
# Test hook: "chunk:N" / "commit:N" / "journal:N" SIGKILLs this process right after the N-th
# written chunk, shard rename, or journal update -- the points a real crash can fall between.
KILL_ENV = "SGLANG_DS41_CONVERT_KILL_AT"


C, D, R = TypeVar("C"), TypeVar("D"), TypeVar("R")


class ConvertError(Ds41Error):
    """The conversion cannot run: bad source, unsupported request, unusable target."""


# --- the plan -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Table:
    """One Engram table to re-encode; `weight`/`scale` locate the source bytes."""

    layer: int
    rows: int
    width: int  # values per row (head_dim)
    weight: StoredTensor
    scale: StoredTensor

    @property
    def prefix(self) -> str:
        return self.weight.name.removesuffix(".weight")


@dataclass(frozen=True)
class Job:
    """One output tensor: copied from `source`, or the `part` (weight | scale) of a converted table."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    nbytes: int
    source: StoredTensor
    table: Table | None = None
    part: str | None = None


@dataclass(frozen=True)
class Shard:
    file: str
    jobs: tuple[Job, ...]
    header: bytes
    offsets: tuple[int, ...]  # absolute file offset of each job's data

    @property
    def size(self) -> int:
        return len(self.header) + sum(j.nbytes for j in self.jobs)

    @property
    def tables(self) -> list[Table]:
        seen: dict[str, Table] = {}
        for j in self.jobs:
            if j.table is not None:
                seen.setdefault(j.table.prefix, j.table)
        return list(seen.values())


@dataclass(frozen=True)
class Plan:
    src: Path
    dst: Path
    to: str
    source_format: str
    tables: tuple[Table, ...]
    shards: tuple[Shard, ...]
    config_json: bytes
    index_json: bytes | None
    other_files: tuple[str, ...]
    fingerprint: str
    source_bytes: int  # sum of source shard sizes
    mxfp4_layers: tuple[int, ...] = field(default=())

    @property
    def output_bytes(self) -> int:
        return sum(s.size for s in self.shards)

    @property
    def rows(self) -> int:
        return sum(t.rows for t in self.tables)

    @property
    def table_bytes_in(self) -> int:
        return sum((t.weight.end - t.weight.start) + (t.scale.end - t.scale.start) for t in self.tables)

    @property
    def table_bytes_out(self) -> int:
        return sum(j.nbytes for s in self.shards for j in s.jobs if j.table is not None)

    @property
    def journal_key(self) -> dict[str, Any]:
        """What a journal must match for DST to be this conversion's output."""
        return {
            "source": str(self.src),
            "source_fingerprint": self.fingerprint,
            "to": self.to,
            "layers": [t.layer for t in self.tables],
        }


def _raw_header(path: Path) -> bytes:
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        return f.read(n)


def _out_spec(table: Table, part: str, to: str) -> tuple[str, tuple[int, ...], int]:
    if part == "scale":
        return table.scale.dtype, table.scale.shape, table.scale.end - table.scale.start
    if to == "mxfp4":
        return "U8", (table.rows, table.width // 2), table.rows * table.width // 2
    return "F8_E4M3", (table.rows, table.width), table.rows * table.width


def _entry(job: Job) -> HeaderEntry:
    return HeaderEntry(job.name, job.dtype, job.shape, job.nbytes)


def make_plan(src: str | Path, dst: str | Path, to: str, layers: Iterable[int] | None = None) -> Plan:
    """Validate the source and the request; lay out every output file. Reads only headers."""
    if to not in FORMATS:
        raise ConvertError(f"unknown Engram format {to!r}: expected one of {list(FORMATS)}")
    src, dst = Path(src).resolve(), Path(dst).resolve()
    if src == dst or src in dst.parents:
        raise ConvertError(f"DST_DIR {dst} must not be SRC_DIR or inside it")
    ckpt = Checkpoint.open(src)  # CheckpointError names missing / truncated shards, bad tensors
    formats_by_layer = dict(ckpt.manifest.engram_formats)
    if not formats_by_layer:
        raise ConvertError(f"{src}: the config declares no Engram layers; nothing to convert")
    wanted = sorted(formats_by_layer) if layers is None else sorted(set(layers))
    unknown = [layer for layer in wanted if layer not in formats_by_layer]
    if unknown:
        raise ConvertError(f"--layers {unknown}: not Engram layers (those are {sorted(formats_by_layer)})")
    source_format = "fp8" if to == "mxfp4" else "mxfp4"
    todo = [layer for layer in wanted if formats_by_layer[layer] == source_format]
    if not todo:
        raise ConvertError(
            f"{src}: the Engram tables of layer(s) {wanted} are already {to.upper()} "
            f"(quantization_config.engram_embed_quant / engram_embed_layers); nothing to convert"
        )
    tables = []
    for layer in todo:
        weight = ckpt.stored[f"layers.{layer}.engram.embed.weight"]
        scale = ckpt.stored[f"layers.{layer}.engram.embed.scale"]
        width = scale.shape[1] * MX_BLOCK
        tables.append(Table(layer, weight.shape[0], width, weight, scale))
    by_name = {t.weight.name: (t, "weight") for t in tables} | {t.scale.name: (t, "scale") for t in tables}

    shards, digest = [], hashlib.sha256()
    for file, header in sorted(ckpt.shards.items()):
        raw = _raw_header(src / file)
        digest.update(f"{file}\0{header.size}\0".encode() + raw)
        metadata = json.loads(raw).get("__metadata__")
        jobs = []
        for stored in header.tensors.values():
            table, part = by_name.get(stored.name, (None, None))
            if table is None:
                jobs.append(Job(stored.name, stored.dtype, stored.shape, stored.end - stored.start, stored))
            else:
                dtype, shape, nbytes = _out_spec(table, part, to)
                jobs.append(Job(stored.name, dtype, shape, nbytes, stored, table, part))
        order = {e.name: i for i, e in enumerate(canonical_order([_entry(j) for j in jobs]))}
        jobs.sort(key=lambda j: order[j.name])
        head, offsets = build_header([_entry(j) for j in jobs], metadata)
        shards.append(Shard(file, tuple(jobs), head, tuple(len(head) + o for o in offsets)))

    config_raw = (src / CONFIG_FILE).read_bytes()
    index_raw = (src / INDEX_FILE).read_bytes() if (src / INDEX_FILE).is_file() else None
    digest.update(config_raw + (index_raw or b""))
    mxfp4 = {layer for layer, fmt in formats_by_layer.items() if fmt == "mxfp4"}
    mxfp4 = (mxfp4 | set(todo)) if to == "mxfp4" else (mxfp4 - set(todo))
    out_size = sum(j.nbytes for s in shards for j in s.jobs)
    skip = {CONFIG_FILE, INDEX_FILE, *ckpt.shards}
    others = tuple(sorted(p.name for p in src.iterdir() if p.name not in skip and not p.name.startswith(".")))
    plan = Plan(
        src=src,
        dst=dst,
        to=to,
        source_format=source_format,
        tables=tuple(tables),
        shards=tuple(shards),
        config_json=_new_config(config_raw, mxfp4, src),
        index_json=_new_index(index_raw, out_size) if index_raw is not None else None,
        other_files=others,
        fingerprint=digest.hexdigest(),
        source_bytes=sum(h.size for h in ckpt.shards.values()),
        mxfp4_layers=tuple(sorted(mxfp4)),
    )
    ckpt.close()
    return plan


def _new_config(raw: bytes, mxfp4_layers: set[int], src: Path) -> bytes:
    """config.json with the Engram entries of `quantization_config` describing the output.

    `engram_embed_layers` lists the MXFP4 layers (absent would mean all); with none left the
    three entries are dropped, which is how the official FP8 release reads."""
    data = json.loads(raw)
    if not isinstance(data, dict):
        raise ConvertError(f"{src / CONFIG_FILE}: expected a JSON object")
    quant = data.setdefault("quantization_config", {})
    for key in ("engram_embed_quant", "engram_embed_block_size", "engram_embed_layers"):
        quant.pop(key, None)
    if mxfp4_layers:
        quant.update(
            engram_embed_quant="mxfp4",
            engram_embed_block_size=MX_BLOCK,
            engram_embed_layers=sorted(mxfp4_layers),
        )
    return (json.dumps(data, indent=2, ensure_ascii=False) + "\n").encode()


def _new_index(raw: bytes, total_size: int) -> bytes:
    data = json.loads(raw)
    data.setdefault("metadata", {})["total_size"] = total_size
    return (json.dumps(data, indent=2, ensure_ascii=False) + "\n").encode()


# --- dry run ------------------------------------------------------------------------------------


def _gb(n: float) -> str:
    return f"{n / 1e9:,.2f} GB"


def measure_rows_per_second(plan: Plan, rows: int = 1 << 16, workers: int | None = None) -> float:
    """Re-encode the first `rows` rows of the first table (real data) as the run would, timed;
    nothing is written. The compiled loop is loaded first, so the figure is the steady rate."""
    t = plan.tables[0]
    n = min(rows, t.rows)
    with _Sources(plan.src) as sources:
        recode(plan.to, *sources.rows(t, 0, 1))
        w, s = sources.rows(t, 0, n)
        start = time.perf_counter()
        recode(plan.to, w, s, workers=workers or default_workers())
        return n / max(time.perf_counter() - start, 1e-9)


def describe_plan(plan: Plan, rows_per_s: float, disk_bytes_per_s: float) -> str:
    copy_bytes = plan.output_bytes - plan.table_bytes_out
    # Table rows are re-encoded while the next ones are read: the slower of the two counts.
    table_seconds = max(plan.rows / rows_per_s, plan.table_bytes_in / disk_bytes_per_s)
    seconds = copy_bytes / disk_bytes_per_s + table_seconds
    with_tables = sum(1 for s in plan.shards if s.tables)
    lines = [
        f"convert-engram plan: {plan.src} -> {plan.dst}",
        f"  Engram tables   {plan.source_format.upper()} -> {plan.to.upper()}: "
        + ", ".join(f"layer {t.layer} ({t.rows:,} rows)" for t in plan.tables),
        f"  shards          {len(plan.shards)} ({with_tables} with Engram tables)",
        f"  bytes in        {plan.source_bytes:,} ({_gb(plan.source_bytes)}); "
        f"Engram {_gb(plan.table_bytes_in)}",
        f"  bytes out       {plan.output_bytes:,} ({_gb(plan.output_bytes)}); "
        f"Engram {_gb(plan.table_bytes_out)}",
        f"  other files     {', '.join(plan.other_files) or '-'} (+ index, config.json)",
        f"  config          engram_embed_quant / engram_embed_layers -> "
        f"{list(plan.mxfp4_layers) or 'removed (all FP8)'}",
        f"  time estimate   {seconds / 60:,.1f} min = {_gb(copy_bytes)} copied at "
        f"{disk_bytes_per_s / 1e6:,.0f} MB/s (assumed disk) + {plan.rows:,} rows at the slower of "
        f"{rows_per_s:,.0f} rows/s (measured here) and the disk",
        f"  free on target  {_gb(free_bytes(_existing_parent(plan.dst)))}",
    ]
    return "\n".join(lines)


def _existing_parent(path: Path) -> Path:
    while not path.exists() and path.parent != path:
        path = path.parent
    return path


# --- reading the source -------------------------------------------------------------------------


class _Sources:
    """Open source shards; reads go into buffers that are reused, so RSS stays bounded."""

    def __init__(self, root: Path):
        self.root = root
        self._fds: dict[str, int] = {}

    def fd(self, file: str) -> int:
        if file not in self._fds:
            try:
                self._fds[file] = os.open(self.root / file, os.O_RDONLY)
            except OSError as error:
                raise ConvertError(f"cannot read source shard {self.root / file}: {error.strerror}") from None
        return self._fds[file]

    def read_into(self, file: str, offset: int, view: memoryview) -> None:
        fd = self.fd(file)
        try:
            while view:
                n = os.preadv(fd, [view], offset)
                if n == 0:
                    raise ConvertError(f"source shard {self.root / file} ended early at byte {offset}")
                view, offset = view[n:], offset + n
        except OSError as error:
            raise ConvertError(f"cannot read source shard {self.root / file}: {error.strerror}") from None

    def rows(self, t: Table, start: int, stop: int) -> tuple[np.ndarray, np.ndarray]:
        """Source weight and scale bytes of rows [start, stop) as uint8 [n, bytes per row]."""
        out = []
        for stored in (t.weight, t.scale):
            per_row = (stored.end - stored.start) // t.rows
            buf = np.empty((stop - start, per_row), np.uint8)
            self.read_into(stored.file, stored.start + start * per_row, memoryview(buf).cast("B"))
            out.append(buf)
        return out[0], out[1]

    def close(self) -> None:
        for fd in self._fds.values():
            os.close(fd)
        self._fds.clear()

    def __enter__(self) -> _Sources:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


# --- journal ------------------------------------------------------------------------------------


class _Journal:
    """DST's record of finished output shards, rewritten atomically after each one."""

    def __init__(self, plan: Plan, pwrite: PWrite):
        self.path = plan.dst / JOURNAL
        self.plan = plan
        self.pwrite = pwrite
        self.data: dict[str, Any] = {
            "kind": JOURNAL_KIND,
            **plan.journal_key,
            "complete": False,
            "shards": {},
        }

    def load_or_start(self) -> None:
        """Adopt DST's journal if it is this conversion's; refuse any other non-empty DST."""
        dst = self.plan.dst
        if dst.exists() and not dst.is_dir():
            raise ConvertError(f"DST_DIR {dst} exists and is not a directory")
        entries = sorted(p.name for p in dst.iterdir()) if dst.is_dir() else []
        if self.path.is_file():
            try:
                old = json.loads(self.path.read_text())
            except (OSError, ValueError) as error:
                raise ConvertError(f"{self.path}: unreadable conversion journal ({error})") from None
            key = {k: old.get(k) for k in self.plan.journal_key}
            if old.get("kind") != JOURNAL_KIND or key != self.plan.journal_key:
                raise ConvertError(
                    f"DST_DIR {dst} holds a different conversion (source {old.get('source')!r}, "
                    f"to {old.get('to')!r}, layers {old.get('layers')}) than this one (source "
                    f"{str(self.plan.src)!r}, to {self.plan.to!r}, layers {key_layers(self.plan)}) "
                    "or the source changed since; use an empty DST_DIR"
                )
            self.data = old
        elif entries:
            raise ConvertError(
                f"DST_DIR {dst} is not empty ({', '.join(entries[:5])}{', ...' if len(entries) > 5 else ''}) "
                f"and holds no {JOURNAL} of this conversion; use an empty or new directory"
            )
        else:
            try:
                dst.mkdir(parents=True, exist_ok=True)
            except OSError as error:
                raise OutputError(describe_os_error(error, dst)) from None
            self.save()

    @property
    def complete(self) -> bool:
        return bool(self.data.get("complete"))

    def finished(self, shard: Shard) -> bool:
        entry = self.data["shards"].get(shard.file)
        path = self.plan.dst / shard.file
        return (
            bool(entry)
            and entry.get("size") == shard.size
            and path.is_file()
            and path.stat().st_size == shard.size
        )

    def record(self, shard: Shard) -> None:
        self.data["shards"][shard.file] = {"size": shard.size}
        self.save()

    def save(self) -> None:
        text = json.dumps(self.data, indent=1, sort_keys=False) + "\n"
        write_bytes_atomic(self.path, text.encode(), self.pwrite)
        _hook("journal")


def key_layers(plan: Plan) -> list[int]:
    return [t.layer for t in plan.tables]


_hook_counts: dict[str, int] = {}


def _hook(event: str) -> None:
    """The kill-at hook (see KILL_ENV); a no-op unless the variable is set."""
    spec = os.environ.get(KILL_ENV)
    if not spec:
        return
    kind, _, n = spec.partition(":")
    if kind != event:
        return
    _hook_counts[event] = _hook_counts.get(event, 0) + 1
    if _hook_counts[event] >= int(n):
        os.kill(os.getpid(), signal.SIGKILL)


# --- writing ------------------------------------------------------------------------------------


@dataclass
class _Progress:
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
    """A chunk's re-encoded rows, per output tensor stored in this shard."""

    parts: dict[Job, np.ndarray]
    seconds: float


def _overlapped(
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


def _write_shard(
    plan: Plan,
    shard: Shard,
    sources: _Sources,
    chunk_rows: int,
    pwrite: PWrite,
    progress: _Progress,
    after: int,
    workers: int,
) -> None:
    """Write one output shard: its header, copies of the untouched tensors, the re-encoded rows."""
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
                _hook("chunk")

        # Engram tables: row chunks, re-encoded here (over `workers` threads) on their way out.
        rows_chunks = [
            (table, start, min(start + chunk_rows, table.rows))
            for table in shard.tables
            for start in range(0, table.rows, chunk_rows)
        ]
        # A table's weight and scale may sit in different shards: each shard writes its own part.
        parts = {(j.table.layer, j.part): j for j in shard.jobs if j.table is not None}

        def read_rows(chunk: tuple[Table, int, int]) -> tuple[np.ndarray, np.ndarray]:
            return sources.rows(*chunk)

        def recode_rows(chunk: tuple[Table, int, int], rows: tuple[np.ndarray, np.ndarray]) -> _Recoded:
            begin = time.perf_counter()
            w, s = recode(plan.to, *rows, workers=workers)
            out_parts = {"weight": np.ascontiguousarray(w), "scale": np.ascontiguousarray(s)}
            kept = {
                parts[chunk[0].layer, p]: data
                for p, data in out_parts.items()
                if (chunk[0].layer, p) in parts
            }
            return _Recoded(kept, time.perf_counter() - begin)

        def write_rows(chunk: tuple[Table, int, int], recoded: _Recoded) -> None:
            table, start, _ = chunk
            for job, data in recoded.parts.items():
                out.write_at(where[job.name] + start * (job.nbytes // table.rows), data.data)

        def wrote_rows(chunk: tuple[Table, int, int], recoded: _Recoded) -> None:
            progress.advance(
                sum(d.nbytes for d in recoded.parts.values()), chunk[2] - chunk[1], recoded.seconds
            )
            _hook("chunk")

        _overlapped(rows_chunks, read_rows, recode_rows, write_rows, wrote_rows)
        out.commit()
    _hook("commit")


def _copy_other(plan: Plan, name: str, pwrite: PWrite) -> None:
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


def _remove_partials(dst: Path) -> None:
    for p in dst.iterdir():
        if p.name.endswith(PARTIAL_SUFFIX):
            shutil.rmtree(p) if p.is_dir() else p.unlink()


def _check_space(plan: Plan, todo: list[Shard]) -> None:
    needed = sum(s.size for s in todo) + sum(
        (plan.src / n).stat().st_size for n in plan.other_files if (plan.src / n).is_file()
    )
    free = free_bytes(plan.dst)
    if 0 <= free < needed:
        raise OutputError(
            f"not enough space on {plan.dst}: the conversion still needs {needed:,} bytes "
            f"({_gb(needed)}; {len(todo)} shard(s) + other files), {free:,} bytes are free"
        )


@dataclass
class Result:
    plan: Plan
    written: list[str]
    skipped: list[str]
    seconds: float
    rows_per_s: float
    verification: Any = None


def convert(
    src: str | Path,
    dst: str | Path,
    to: str = "mxfp4",
    *,
    layers: Iterable[int] | None = None,
    chunk_rows: int = DEFAULT_CHUNK_ROWS,
    workers: int | None = None,
    progress: bool = False,
    verify_rows: int = 1024,
    check_space: bool = True,
    pwrite: PWrite = os.pwrite,
    log: Callable[[str], None] = print,
) -> Result:
    """Convert SRC's Engram tables into DST (resuming a previous run there), then verify."""
    from sglang_ds41.checkpoint.verify_convert import verify

    if chunk_rows <= 0:
        raise ConvertError(f"chunk_rows must be positive, got {chunk_rows}")
    workers = workers or default_workers()
    start = time.perf_counter()
    plan = make_plan(src, dst, to, layers)
    journal = _Journal(plan, pwrite)
    journal.load_or_start()
    written, skipped = [], []
    prog = _Progress(None)
    if not journal.complete:
        _remove_partials(plan.dst)
        todo = [s for s in plan.shards if not journal.finished(s)]
        skipped = [s.file for s in plan.shards if s not in todo]
        if skipped:
            log(f"resuming: {len(skipped)} of {len(plan.shards)} shard(s) already done")
        if check_space:
            _check_space(plan, todo)
        bar = None
        if progress:
            from tqdm import tqdm

            bar = tqdm(total=sum(s.size for s in todo), unit="B", unit_scale=True, desc="convert-engram")
        prog.bar = bar
        remaining = sum(s.size for s in todo)
        with _Sources(plan.src) as sources:
            for shard in todo:
                remaining -= shard.size
                _write_shard(plan, shard, sources, chunk_rows, pwrite, prog, remaining, workers)
                journal.record(shard)
                written.append(shard.file)
        if bar is not None:
            bar.close()
        for name in plan.other_files:
            _copy_other(plan, name, pwrite)
        if plan.index_json is not None:
            write_bytes_atomic(plan.dst / INDEX_FILE, plan.index_json, pwrite)
        write_bytes_atomic(plan.dst / CONFIG_FILE, plan.config_json, pwrite)  # last: marks a checkpoint
        journal.data["complete"] = True
        journal.save()
    else:
        log(f"{plan.dst}: conversion already complete; verifying")
    result = Result(
        plan, written, skipped, time.perf_counter() - start, prog.rows / max(prog.convert_seconds, 1e-9)
    )
    result.verification = verify(plan, rows=verify_rows)
    return result
