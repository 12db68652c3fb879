"""The plan of a conversion: which tables are re-encoded into which tensors, and every output
shard laid out (header, offsets) before a byte is written; read from headers only (and, for
NVFP4, the source tables' scale bytes)."""

from __future__ import annotations

import hashlib
import json
import math
import struct
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from sglang_ds41 import formats
from sglang_ds41.checkpoint.convert.errors import ConvertError
from sglang_ds41.checkpoint.convert.quality import REPORT_FILE
from sglang_ds41.checkpoint.convert.recode import SCALE_RULES, TARGETS, default_scale_rule
from sglang_ds41.checkpoint.convert.source import Sources
from sglang_ds41.checkpoint.manifest import DTYPE_BYTES
from sglang_ds41.checkpoint.reader import CONFIG_FILE, INDEX_FILE, Checkpoint, StoredTensor
from sglang_ds41.checkpoint.st_writer import HeaderEntry, build_header, canonical_order
from sglang_ds41.formats.engram import FP8, MXFP4, NVFP4, EngramFormat, engram_format, tensor_name

FORMATS = TARGETS
# Which source format each target is converted from: 4-bit tables from the official FP8 ones;
# FP8 back from MXFP4 (lossless; NVFP4 values need up to 6 significant bits, FP8 holds 4).
SOURCE_OF = {MXFP4.name: FP8.name, NVFP4.name: FP8.name, FP8.name: MXFP4.name}
SCALE_SCAN_ROWS = 1 << 22  # scale rows read per step while finding an NVFP4 table's global scale


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
    with Sources(src) as sources:
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
    skip = {CONFIG_FILE, INDEX_FILE, REPORT_FILE, *ckpt.shards}
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


def _global_scale(sources: Sources, table: Table) -> float:
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
        raise ConvertError(f"{src / CONFIG_FILE}: expected a JSON object, got {type(data).__name__}")
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
