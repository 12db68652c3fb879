"""Check a finished `convert-engram` output against its source.

Three checks, cheapest first: the output opens through the validating reader (names, shapes,
dtypes, sizes per the manifest of the new config); its tensors are the source's, one for one,
with only the converted tables' dtype/shape (and for NVFP4 names) changed; sampled rows of every
converted table equal the definition (`formats.fp8_rows_to_mxfp4` / `fp8_rows_to_nvfp4` with the
plan's scale rule and global scale, not the fast path that wrote them) applied to the source
rows, NVFP4's stored global scale is the plan's, and a sample of copied tensors is
byte-identical. What the re-encoding cost is `quality`'s report, measured on every row.
"""

from __future__ import annotations

import hashlib
import os
import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from sglang_ds41.checkpoint.convert.recode import mxfp4_to_fp8
from sglang_ds41.checkpoint.reader import Checkpoint, CheckpointError, StoredTensor
from sglang_ds41.errors import Ds41Error
from sglang_ds41.formats.engram import FP8

COPY_SAMPLE_MAX_BYTES = 64 << 20


class VerificationError(Ds41Error):
    """The written checkpoint does not match its source."""


@dataclass(frozen=True)
class TableStats:
    layer: int
    rows_checked: int

    def describe(self) -> str:
        return f"layer {self.layer}: {self.rows_checked} sampled rows equal the definition"


@dataclass(frozen=True)
class Verification:
    tensors: int
    tables: tuple[TableStats, ...]
    copies_checked: int

    def describe(self) -> str:
        lines = [
            f"verified: {self.tensors:,} tensors (names, shapes, dtypes), {self.copies_checked} copied "
            "tensors byte-identical, sampled Engram rows equal the definition"
        ]
        return "\n".join(lines + [f"  {t.describe()}" for t in self.tables])


def _read(path: Path, start: int, n: int) -> bytes:
    with open(path, "rb") as f:
        return os.pread(f.fileno(), n, start)


def _rows(root: Path, stored: StoredTensor, rows: int, index: np.ndarray) -> np.ndarray:
    per_row = (stored.end - stored.start) // rows
    out = np.empty((len(index), per_row), np.uint8)
    with open(root / stored.file, "rb") as f:
        for i, r in enumerate(index):
            out[i] = np.frombuffer(os.pread(f.fileno(), per_row, stored.start + int(r) * per_row), np.uint8)
    return out


def _expected(plan, table, weight: np.ndarray, scale: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    if plan.to == FP8.name:
        return mxfp4_to_fp8(weight, scale)
    values = torch.from_numpy(weight).view(FP8.values.torch_dtype())
    scales = torch.from_numpy(scale).view(FP8.scales.torch_dtype())
    ws2 = None if table.global_scale is None else torch.tensor(table.global_scale, dtype=torch.float32)
    codes, out_scales, *_ = plan.target.from_fp8_rows(values, scales, plan.scale_rule, ws2)
    return codes.view(torch.uint8).numpy(), out_scales.view(torch.uint8).numpy()


def _check_table(
    plan, table, dst: dict[str, StoredTensor], rows: int, rng: np.random.Generator
) -> TableStats:
    n = min(rows, table.rows)
    index = np.unique(np.concatenate([[0, table.rows - 1], rng.integers(0, table.rows, n)]))
    values_name, scales_name = (f"{table.prefix}.{part}" for part in plan.output_parts)
    sw = _rows(plan.src, table.weight, table.rows, index)
    ss = _rows(plan.src, table.scale, table.rows, index)
    dw = _rows(plan.dst, dst[values_name], table.rows, index)
    ds = _rows(plan.dst, dst[scales_name], table.rows, index)
    want_w, want_s = _expected(plan, table, sw, ss)
    bad = np.flatnonzero((want_w != dw).any(axis=1) | (want_s != ds).any(axis=1))
    if bad.size:
        raise VerificationError(
            f"{plan.dst}: layer {table.layer} Engram row {int(index[bad[0]])} (and {bad.size - 1} more "
            f"of {index.size} sampled) differs from the {plan.to.upper()} encoding of the source row"
        )
    if plan.target.global_scale is not None:
        stored = dst[f"{table.prefix}.{plan.target.global_scale.name}"]
        (got,) = struct.unpack("<f", _read(plan.dst / stored.file, stored.start, 4))
        if got != table.global_scale:
            raise VerificationError(
                f"{plan.dst}: {stored.name} is {got!r}, expected {table.global_scale!r} (from the source's "
                "FP8 scales)"
            )
    return TableStats(layer=table.layer, rows_checked=int(index.size))


def verify(plan, rows: int = 1024, copies: int = 16, seed: int = 0) -> Verification:
    """Raise `VerificationError` on any mismatch; return what was checked."""
    try:
        out = Checkpoint.open(plan.dst)
    except CheckpointError as error:
        raise VerificationError(f"the converted checkpoint does not validate: {error}") from None
    out.close()
    jobs = {j.name: j for s in plan.shards for j in s.jobs}
    if set(out.stored) != set(jobs):
        missing, extra = sorted(set(jobs) - set(out.stored)), sorted(set(out.stored) - set(jobs))
        raise VerificationError(
            f"{plan.dst}: tensors differ from the source: missing {missing[:5]}, extra {extra[:5]}"
        )
    for name, job in jobs.items():
        got = out.stored[name]
        if (got.dtype, got.shape, got.file) != (job.dtype, job.shape, job.source.file):
            raise VerificationError(
                f"{plan.dst}: tensor {name} is {got.dtype} {list(got.shape)} in {got.file}, "
                f"expected {job.dtype} {list(job.shape)} in {job.source.file}"
            )
    rng = np.random.default_rng(seed)
    stats = tuple(_check_table(plan, t, out.stored, rows, rng) for t in plan.tables)
    copied = [j for j in jobs.values() if j.table is None and j.nbytes <= COPY_SAMPLE_MAX_BYTES]
    picked = [copied[i] for i in rng.choice(len(copied), min(copies, len(copied)), replace=False)]
    for job in picked:
        a = hashlib.sha256(_read(plan.src / job.source.file, job.source.start, job.nbytes)).digest()
        got = out.stored[job.name]
        b = hashlib.sha256(_read(plan.dst / got.file, got.start, job.nbytes)).digest()
        if a != b:
            raise VerificationError(f"{plan.dst}: tensor {job.name} is not a byte copy of the source's")
    return Verification(len(jobs), stats, len(picked))
