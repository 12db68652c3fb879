"""`convert-engram`: re-encode a checkpoint's Engram tables FP8 -> MXFP4 / NVFP4 (or MXFP4 -> FP8).

The official tables are 202 GB of FP8 (264 B/row); as MXFP4 (136 B/row) a TP=4 rank holds an
Engram table in 12.2 GiB instead of 23.6 GiB (MODEL.md §8.4, §9.2), as NVFP4 (144 B/row, the
format of `formats/nvfp4.py`'s docstring) in 12.9 GiB. Both 4-bit targets choose each block's
scale for the least squared error by default (``--scale-rule mse``; ``ocp`` / ``modelopt`` give
the standard amax rules), and every conversion measures what it lost (`engram_quality`). Users
convert the files they downloaded, so the conversion must survive what a 500 GB job meets:

* bounded memory: source rows are read with ``pread`` (a memory map would keep every touched
  page resident, i.e. RSS = table size) in row chunks, at most three alive at a time; every
  other tensor is copied byte for byte by the kernel (``copy_file_range``), never through a
  float or through this process;
* near disk speed: the table rows are re-encoded by a compiled loop on all cores while the next
  chunk is read and the previous one written (`_overlapped`);
* atomic + resumable: each output file is written as ``*.partial``, fsync'd and renamed; the
  journal ``.convert-engram.json`` in DST records finished shards (their sizes and the quality
  statistics of the rows they hold), so a rerun after a kill skips them and redoes the rest;
  the quality report ``engram_quality.json`` and then config.json are written last;
* verified: the result is opened through the validating reader (tensor names, shapes, dtypes,
  sizes), compared with the source tensor by tensor, and sampled rows are checked against the
  definition (`formats`, not the fast path that wrote them).
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import shutil
import signal
import struct
import time
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, TypeVar

import numpy as np

from sglang_ds41 import formats
from sglang_ds41.checkpoint import engram_quality
from sglang_ds41.checkpoint.engram_quality import Quality, TableReport
from sglang_ds41.checkpoint.engram_recode import (
    SCALE_RULES,
    TARGETS,
    default_scale_rule,
    default_workers,
    recode,
)
from sglang_ds41.checkpoint.manifest import DTYPE_BYTES
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
from sglang_ds41.formats.engram import FP8, MXFP4, NVFP4, EngramFormat, engram_format, tensor_name

FORMATS = TARGETS
# Which source format each target is converted from: 4-bit tables from the official FP8 ones;
# FP8 back from MXFP4 (lossless; NVFP4 values need up to 6 significant bits, FP8 holds 4).
SOURCE_OF = {MXFP4.name: FP8.name, NVFP4.name: FP8.name, FP8.name: MXFP4.name}
JOURNAL = ".convert-engram.json"
JOURNAL_KIND = "sglang-ds41 convert-engram journal v1"
DEFAULT_REPORT_ROWS = 1 << 16
DEFAULT_CHUNK_ROWS = 1 << 16  # ~17 MB of FP8 rows in, ~100 MB of transient arrays
COPY_CHUNK = 16 << 20
SCALE_SCAN_ROWS = 1 << 22  # scale rows read per step while finding an NVFP4 table's global scale
# Test hook: "chunk:N" / "commit:N" / "journal:N" SIGKILLs this process right after the N-th
# written chunk, shard rename, or journal update -- the points a real crash can fall between.
KILL_ENV = "SGLANG_DS41_CONVERT_KILL_AT"


C, D, R = TypeVar("C"), TypeVar("D"), TypeVar("R")


class ConvertError(Ds41Error):
    """The conversion cannot run: bad source, unsupported request, unusable target."""


# --- the plan -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Table:
    """One Engram table to re-encode; `weight`/`scale` locate the source bytes. `global_scale`:
    an NVFP4 target's float32 ``weight_scale_2``, fixed for the whole table before any row."""

    layer: int
    rows: int
    width: int  # values per row (head_dim)
    weight: StoredTensor
    scale: StoredTensor
    global_scale: float | None = None

    @property
    def prefix(self) -> str:
        return self.weight.name.removesuffix(".weight")


@dataclass(frozen=True)
class Job:
    """One output tensor: copied from `source`, or the `part` of a converted table: ``weight``,
    ``scale`` (renamed ``weight_scale`` for NVFP4) or NVFP4's ``weight_scale_2``, which has no
    source tensor and sits in the weight's shard (`source` is then the source weight)."""

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
    scale_rule: str
    source_format: str
    tables: tuple[Table, ...]
    shards: tuple[Shard, ...]
    config_json: bytes
    index_json: bytes | None
    other_files: tuple[str, ...]
    fingerprint: str
    source_bytes: int  # sum of source shard sizes
    quant_layers: tuple[int, ...] = field(default=())  # 4-bit Engram layers of the output's config

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
            "scale_rule": self.scale_rule,
            "layers": [t.layer for t in self.tables],
        }

    @property
    def target(self) -> EngramFormat:
        return engram_format(self.to)

    @property
    def output_parts(self) -> tuple[str, str]:
        """The output's names for the rows' (values, scales) parts."""
        return self.target.values.name, self.target.scales.name


def _raw_header(path: Path) -> bytes:
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        return f.read(n)


def _out_jobs(table: Table, stored: StoredTensor, to: str) -> list[Job]:
    """The output tensors a source table tensor turns into: its weight becomes the target's values
    (and NVFP4's global scale, which has no source), its scale the target's scales."""
    target, source_scales = engram_format(to), engram_format(SOURCE_OF[to]).scales
    shapes = target.shapes(table.rows, table.width)
    if stored.name == table.scale.name:
        parts = [target.scales]
    else:
        parts = [target.values] + ([target.global_scale] if target.global_scale is not None else [])
    jobs = []
    for part in parts:
        # scales of the same kind keep the source's spelling of their bytes (E8M0 or U8)
        dtype = table.scale.dtype if part is source_scales else part.dtype
        shape = shapes[part]
        nbytes = math.prod(shape) * DTYPE_BYTES[dtype]
        jobs.append(Job(f"{table.prefix}.{part.name}", dtype, shape, nbytes, stored, table, part.name))
    return jobs


def _entry(job: Job) -> HeaderEntry:
    return HeaderEntry(job.name, job.dtype, job.shape, job.nbytes)


def resolve_scale_rule(to: str, scale_rule: str | None) -> str:
    """`scale_rule` checked against the target (None: the target's default)."""
    if to not in FORMATS:
        raise ConvertError(f"unknown Engram format {to!r}: expected one of {list(FORMATS)}")
    if scale_rule is None:
        return default_scale_rule(to)
    if scale_rule not in SCALE_RULES[to]:
        raise ConvertError(
            f"--scale-rule {scale_rule!r} does not apply to --to {to}: expected one of "
            f"{list(SCALE_RULES[to])} (ocp is MXFP4's rule, modelopt NVFP4's; mse works for both)"
        )
    return scale_rule


def make_plan(
    src: str | Path,
    dst: str | Path,
    to: str,
    layers: Iterable[int] | None = None,
    scale_rule: str | None = None,
) -> Plan:
    """Validate the source and the request; lay out every output file. Reads headers only, and
    for NVFP4 the source tables' scale bytes (their max gives the table's global scale)."""
    scale_rule = resolve_scale_rule(to, scale_rule)
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
    source_format = SOURCE_OF[to]
    _check_formats(src, to, wanted, formats_by_layer)
    todo = [layer for layer in wanted if formats_by_layer[layer] == source_format]
    if not todo:
        raise ConvertError(
            f"{src}: the Engram tables of layer(s) {wanted} are already {to.upper()} "
            f"(quantization_config.engram_embed_quant / engram_embed_layers); nothing to convert"
        )
    tables = []
    with _Sources(src) as sources:
        for layer in todo:
            source = engram_format(source_format)
            weight = ckpt.stored[tensor_name(f"layers.{layer}.engram", source.values)]
            scale = ckpt.stored[tensor_name(f"layers.{layer}.engram", source.scales)]
            width = scale.shape[1] * source.scale_block
            table = Table(layer, weight.shape[0], width, weight, scale)
            if engram_format(to).global_scale is not None:
                table = replace(table, global_scale=_global_scale(sources, table))
            tables.append(table)
    by_name = {t.weight.name: t for t in tables} | {t.scale.name: t for t in tables}

    shards, digest = [], hashlib.sha256()
    for file, header in sorted(ckpt.shards.items()):
        raw = _raw_header(src / file)
        digest.update(f"{file}\0{header.size}\0".encode() + raw)
        metadata = json.loads(raw).get("__metadata__")
        jobs = []
        for stored in header.tensors.values():
            table = by_name.get(stored.name)
            if table is None:
                jobs.append(Job(stored.name, stored.dtype, stored.shape, stored.end - stored.start, stored))
            else:
                jobs += _out_jobs(table, stored, to)
        order = {e.name: i for i, e in enumerate(canonical_order([_entry(j) for j in jobs]))}
        jobs.sort(key=lambda j: order[j.name])
        head, offsets = build_header([_entry(j) for j in jobs], metadata)
        shards.append(Shard(file, tuple(jobs), head, tuple(len(head) + o for o in offsets)))

    config_raw = (src / CONFIG_FILE).read_bytes()
    index_raw = (src / INDEX_FILE).read_bytes() if (src / INDEX_FILE).is_file() else None
    digest.update(config_raw + (index_raw or b""))
    official = FP8.name
    quant = {layer for layer, fmt in formats_by_layer.items() if fmt != official}
    quant = (quant - set(todo)) if to == official else (quant | set(todo))
    quant_format = to if to != official else next(iter(set(formats_by_layer.values()) - {official}), official)
    out_size = sum(j.nbytes for s in shards for j in s.jobs)
    names = {j.name: s.file for s in shards for j in s.jobs}
    skip = {CONFIG_FILE, INDEX_FILE, engram_quality.REPORT_FILE, *ckpt.shards}
    others = tuple(sorted(p.name for p in src.iterdir() if p.name not in skip and not p.name.startswith(".")))
    plan = Plan(
        src=src,
        dst=dst,
        to=to,
        scale_rule=scale_rule,
        source_format=source_format,
        tables=tuple(tables),
        shards=tuple(shards),
        config_json=_new_config(config_raw, quant_format, quant, src),
        index_json=_new_index(index_raw, out_size, names) if index_raw is not None else None,
        other_files=others,
        fingerprint=digest.hexdigest(),
        source_bytes=sum(h.size for h in ckpt.shards.values()),
        quant_layers=tuple(sorted(quant)),
    )
    ckpt.close()
    return plan


def _check_formats(src: Path, to: str, wanted: list[int], formats_by_layer: dict[int, str]) -> None:
    """One config can declare one 4-bit Engram format; refuse what would need two, or NVFP4 -> FP8."""
    if to == FP8.name:
        nv = [layer for layer in wanted if formats_by_layer[layer] == NVFP4.name]
        if nv:
            raise ConvertError(
                f"{src}: the Engram tables of layer(s) {nv} are NVFP4; --to fp8 converts MXFP4 tables "
                "only (an NVFP4 value has up to 6 significant bits, FP8 keeps 4: not lossless)"
            )
        return
    other = sorted(set(formats_by_layer.values()) - {FP8.name, to})
    if other:
        layers = [layer for layer, fmt in sorted(formats_by_layer.items()) if fmt in other]
        raise ConvertError(
            f"{src}: Engram layer(s) {layers} are already {other[0].upper()}; a checkpoint holds one 4-bit "
            f"Engram format (quantization_config.engram_embed_quant), so --to {to} would mix two. "
            f"Convert from the FP8 release, or those layers back with --to fp8 first"
        )


def _global_scale(sources: _Sources, table: Table) -> float:
    """The NVFP4 table's weight_scale_2 from every FP8 scale byte of the table (`formats.nvfp4`)."""
    top = None
    for start in range(0, table.rows, SCALE_SCAN_ROWS):
        s = sources.part(table.scale, table.rows, start, min(start + SCALE_SCAN_ROWS, table.rows))
        finite = s[s != formats.e8m0.NAN_BYTE]
        if finite.size:
            top = max(top or 0, int(finite.max()))
    return float(formats.nvfp4.global_scale_of_scale_byte(top))


def _new_config(raw: bytes, fmt: str, layers: set[int], src: Path) -> bytes:
    """config.json with the Engram entries of `quantization_config` describing the output.

    `engram_embed_layers` lists the 4-bit layers (absent would mean all); with none left the
    three entries are dropped, which is how the official FP8 release reads."""
    data = json.loads(raw)
    if not isinstance(data, dict):
        raise ConvertError(f"{src / CONFIG_FILE}: expected a JSON object")
    quant = data.setdefault("quantization_config", {})
    for key in ("engram_embed_quant", "engram_embed_block_size", "engram_embed_layers"):
        quant.pop(key, None)
    if layers:
        quant.update(
            engram_embed_quant=fmt,
            engram_embed_block_size=engram_format(fmt).scale_block,
            engram_embed_layers=sorted(layers),
        )
    return (json.dumps(data, indent=2, ensure_ascii=False) + "\n").encode()


def _new_index(raw: bytes, total_size: int, names: dict[str, str]) -> bytes:
    """The index of the output: its total size, and the converted tables' names (NVFP4's
    `weight_scale` / `weight_scale_2` replace `scale`) placed in the shards that hold them."""
    data = json.loads(raw)
    data.setdefault("metadata", {})["total_size"] = total_size
    if set(data.get("weight_map", {})) != set(names):
        data["weight_map"] = {n: names[n] for n in sorted(names)}
    return (json.dumps(data, indent=2, ensure_ascii=False) + "\n").encode()


# --- dry run ------------------------------------------------------------------------------------


def _gb(n: float) -> str:
    return f"{n / 1e9:,.2f} GB"


def _encode(plan: Plan, table: Table, rows: tuple[np.ndarray, np.ndarray], workers: int):
    """Source rows -> the output's (values, scales) bytes, as the conversion writes them."""
    rule, ws2 = plan.scale_rule, table.global_scale
    return recode(plan.to, *rows, workers=workers, scale_rule=rule, global_scale=ws2)


def _measure(plan: Plan, table: Table, rows, encoded, workers: int) -> Quality:
    return engram_quality.measure(plan.source_format, *rows, plan.to, *encoded, table.global_scale, workers)


def measure_rows_per_second(plan: Plan, rows: int = 1 << 16, workers: int | None = None) -> float:
    """Re-encode and measure the first `rows` rows of the first table (real data) as the run
    would, timed; nothing is written. The compiled loops are loaded first (steady rate)."""
    t = plan.tables[0]
    n = min(rows, t.rows)
    workers = workers or default_workers()
    with _Sources(plan.src) as sources:
        _warm_up(plan, sources)
        data = sources.rows(t, 0, n)
        start = time.perf_counter()
        _measure(plan, t, data, _encode(plan, t, data, workers), workers)
        return n / max(time.perf_counter() - start, 1e-9)


def _warm_up(plan: Plan, sources: _Sources) -> None:
    """Compile (or load) the re-encoder and the measurement on one row, so the rows/s a run
    reports is the steady rate and not numba's start-up."""
    t = plan.tables[0]
    first = sources.rows(t, 0, 1)
    _measure(plan, t, first, _encode(plan, t, first, 1), 1)


def _sample_runs(rows: int, wanted: int, runs: int = 64) -> list[tuple[int, int]]:
    """`runs` evenly spaced runs of consecutive rows, `wanted` rows in all (or every row)."""
    if wanted >= rows:
        return [(0, rows)]
    length = max(1, wanted // runs)
    starts = np.linspace(0, rows - length, min(runs, wanted)).astype(np.int64)
    return [(int(a), int(a) + length) for a in np.unique(starts)]


def sample_report(
    plan: Plan, rows: int = DEFAULT_REPORT_ROWS, workers: int | None = None
) -> list[TableReport]:
    """The quality report on a sample of each table's rows, encoded as the conversion would;
    nothing is written (``--dry-run --report``)."""
    workers = workers or default_workers()
    reports = []
    with _Sources(plan.src) as sources:
        for t in plan.tables:
            quality = Quality()
            for start, stop in _sample_runs(t.rows, rows):
                data = sources.rows(t, start, stop)
                quality = quality.merge(_measure(plan, t, data, _encode(plan, t, data, workers), workers))
            reports.append(_table_report(plan, t, quality))
    return reports


def _table_report(plan: Plan, table: Table, quality: Quality) -> TableReport:
    t, p = table, plan
    return TableReport(t.layer, t.prefix, t.rows, p.source_format, p.to, p.scale_rule, t.width, quality)


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
        f"  scale rule      {plan.scale_rule}"
        + (
            " (least squared error per block among the standard scale and its neighbours; any "
            f"{plan.to.upper()} decoder reads it)"
            if plan.scale_rule == "mse"
            else ""
        ),
        f"  shards          {len(plan.shards)} ({with_tables} with Engram tables)",
        f"  bytes in        {plan.source_bytes:,} ({_gb(plan.source_bytes)}); "
        f"Engram {_gb(plan.table_bytes_in)}",
        f"  bytes out       {plan.output_bytes:,} ({_gb(plan.output_bytes)}); "
        f"Engram {_gb(plan.table_bytes_out)}",
        f"  other files     {', '.join(plan.other_files) or '-'} (+ index, config.json)",
        f"  config          engram_embed_quant / engram_embed_layers -> "
        f"{list(plan.quant_layers) or 'removed (all FP8)'}",
        f"  time estimate   {seconds / 60:,.1f} min = {_gb(copy_bytes)} copied at "
        f"{disk_bytes_per_s / 1e6:,.0f} MB/s (assumed disk) + {plan.rows:,} rows at the slower of "
        f"{rows_per_s:,.0f} rows/s (re-encoded and measured, here) and the disk",
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

    def part(self, stored: StoredTensor, rows: int, start: int, stop: int) -> np.ndarray:
        """Bytes of rows [start, stop) of a `rows`-row tensor as uint8 [n, bytes per row]."""
        per_row = (stored.end - stored.start) // rows
        buf = np.empty((stop - start, per_row), np.uint8)
        self.read_into(stored.file, stored.start + start * per_row, memoryview(buf).cast("B"))
        return buf

    def rows(self, t: Table, start: int, stop: int) -> tuple[np.ndarray, np.ndarray]:
        """Source weight and scale bytes of rows [start, stop) as uint8 [n, bytes per row]."""
        return self.part(t.weight, t.rows, start, stop), self.part(t.scale, t.rows, start, stop)

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
            if "scale_rule" not in old and old.get("to") in _RULE_BEFORE_RULES:
                old["scale_rule"] = _RULE_BEFORE_RULES[old["to"]]  # journals from before the choice
            key = {k: old.get(k) for k in self.plan.journal_key}
            if old.get("kind") != JOURNAL_KIND or key != self.plan.journal_key:
                raise ConvertError(
                    f"DST_DIR {dst} holds a different conversion (source {old.get('source')!r}, "
                    f"to {old.get('to')!r}, scale rule {old.get('scale_rule')!r}, layers "
                    f"{old.get('layers')}) than this one (source {str(self.plan.src)!r}, to "
                    f"{self.plan.to!r}, scale rule {self.plan.scale_rule!r}, layers "
                    f"{key_layers(self.plan)}) or the source changed since; use an empty DST_DIR"
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

    def record(self, shard: Shard, quality: dict[int, Quality]) -> None:
        self.data["shards"][shard.file] = {
            "size": shard.size,
            "quality": {str(layer): q.to_json() for layer, q in sorted(quality.items())},
        }
        self.save()

    def quality(self) -> dict[int, Quality]:
        """Per table, the statistics of every finished shard merged (in shard order)."""
        out: dict[int, Quality] = {}
        for file in sorted(self.data["shards"]):
            for layer, q in self.data["shards"][file].get("quality", {}).items():
                out[int(layer)] = out.get(int(layer), Quality()).merge(Quality.from_json(q))
        return out

    def save(self) -> None:
        text = json.dumps(self.data, indent=1, sort_keys=False) + "\n"
        write_bytes_atomic(self.path, text.encode(), self.pwrite)
        _hook("journal")


# What a journal written before `--scale-rule` existed converted with.
_RULE_BEFORE_RULES = {MXFP4.name: "ocp", FP8.name: "exact"}


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
    """A chunk's re-encoded rows, per output tensor stored in this shard; their quality when
    this shard is the one that measures the table (the one holding its weight)."""

    parts: dict[Job, np.ndarray]
    seconds: float
    quality: Quality | None


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
                _hook("chunk")

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
            encoded = _encode(plan, table, rows, workers)
            measured = _measure(plan, table, rows, encoded, workers) if table.layer in quality else None
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
            _hook("chunk")

        _overlapped(rows_chunks, read_rows, recode_rows, write_rows, wrote_rows)
        out.commit()
    _hook("commit")
    return quality


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
    report: list[TableReport] = field(default_factory=list)
    verification: Any = None


def _report(plan: Plan, journal: _Journal) -> list[TableReport]:
    quality = journal.quality()
    return [_table_report(plan, t, quality.get(t.layer, Quality())) for t in plan.tables]


def convert(
    src: str | Path,
    dst: str | Path,
    to: str = MXFP4.name,
    *,
    layers: Iterable[int] | None = None,
    scale_rule: str | None = None,
    chunk_rows: int = DEFAULT_CHUNK_ROWS,
    workers: int | None = None,
    progress: bool = False,
    verify_rows: int = 1024,
    check_space: bool = True,
    pwrite: PWrite = os.pwrite,
    log: Callable[[str], None] = print,
) -> Result:
    """Convert SRC's Engram tables into DST (resuming a previous run there), then verify.

    `scale_rule`: the 4-bit targets' block-scale rule (default ``mse``). The quality report of
    every converted row is `Result.report` (`engram_quality.render` prints it) and is written to
    DST as ``engram_quality.json``."""
    from sglang_ds41.checkpoint.verify_convert import verify

    if chunk_rows <= 0:
        raise ConvertError(f"chunk_rows must be positive, got {chunk_rows}")
    workers = workers or default_workers()
    start = time.perf_counter()
    plan = make_plan(src, dst, to, layers, scale_rule)
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
            _warm_up(plan, sources)
            for shard in todo:
                remaining -= shard.size
                quality = _write_shard(plan, shard, sources, chunk_rows, pwrite, prog, remaining, workers)
                journal.record(shard, quality)
                written.append(shard.file)
        if bar is not None:
            bar.close()
        for name in plan.other_files:
            _copy_other(plan, name, pwrite)
        if plan.index_json is not None:
            write_bytes_atomic(plan.dst / INDEX_FILE, plan.index_json, pwrite)
        report = _report(plan, journal)
        write_bytes_atomic(
            plan.dst / engram_quality.REPORT_FILE,
            engram_quality.report_json(str(plan.src), report, None),
            pwrite,
        )
        write_bytes_atomic(plan.dst / CONFIG_FILE, plan.config_json, pwrite)  # last: marks a checkpoint
        journal.data["complete"] = True
        journal.save()
    else:
        log(f"{plan.dst}: conversion already complete; verifying")
        report = _report(plan, journal)
    rows_per_s = prog.rows / max(prog.convert_seconds, 1e-9)
    result = Result(plan, written, skipped, time.perf_counter() - start, rows_per_s, report)
    result.verification = verify(plan, rows=verify_rows)
    return result
