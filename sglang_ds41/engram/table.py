"""One Engram layer's table in host memory, row-sharded over TP ranks (MODEL.md §5, §8.4, §9.2, §13).

The official tables are 384 M rows x 264 B (FP8) — 101 GB per layer — so a rank must never
hold more than its shard: `from_safetensors` memory-maps the checkpoint and copies only this
rank's row range, in chunks, straight into the (pinned, when CUDA is present) buffer that
serves lookups.

Sharding: with `n_columns % tp_size == 0` each rank owns `n_columns / tp_size` whole hash
columns (the 24 prime-sized ranges of `engram/layout.py`); otherwise the rows are split into
`tp_size` near-equal ranges. Either way every row has exactly one owner, a rank returns zero
for rows it does not own, and summing the ranks' lookups (the all-reduce) gives the full
lookup bit for bit.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from sglang_ds41.engram.gather import HEAD_DIM, Quant, TableFormat, gather_dequantize, pack_rows
from sglang_ds41.errors import Ds41Error

# Rows copied per read while loading a shard: bounds the transient extra memory (~35 MB FP8).
LOAD_CHUNK_ROWS = 1 << 17

_TORCH_TO_ST = {
    torch.float8_e4m3fn: "F8_E4M3",
    torch.float8_e8m0fnu: "F8_E8M0",
    torch.uint8: "U8",
    torch.int8: "I8",
}
_SCALE_DTYPES = ("F8_E8M0", "U8")  # E8M0 bits; some writers store them as plain bytes


class EngramTableError(Ds41Error):
    """An Engram table tensor is missing or has a shape/dtype we cannot serve."""


def weight_name(prefix: str) -> str:
    return f"{prefix}.embed.weight"


def scale_name(prefix: str) -> str:
    return f"{prefix}.embed.scale"


def detect_format(
    name: str,
    dtype: str | torch.dtype,
    shape: Sequence[int],
    scale: str,
    scale_dtype: str | torch.dtype,
    scale_shape: Sequence[int],
    head_dim: int = HEAD_DIM,
) -> TableFormat:
    """FP8 if the weight is E4M3 `[rows, head_dim]`, MXFP4 if it is U8/I8 `[rows, head_dim / 2]`.

    With the official head_dim 256 that is width 256 -> FP8, 128 -> 4-bit; anything else
    fails, naming the tensor. The scale must be E8M0 `[rows, head_dim / 32]` in both formats.
    """
    dtype = _TORCH_TO_ST.get(dtype, str(dtype)) if isinstance(dtype, torch.dtype) else dtype
    if isinstance(scale_dtype, torch.dtype):
        scale_dtype = _TORCH_TO_ST.get(scale_dtype, str(scale_dtype))
    shape, scale_shape = list(shape), list(scale_shape)
    width = shape[1] if len(shape) == 2 else None
    if width == head_dim and dtype == "F8_E4M3":
        fmt = TableFormat(Quant.FP8, head_dim)
    elif width == head_dim // 2 and dtype in ("U8", "I8"):
        fmt = TableFormat(Quant.MXFP4, head_dim)
    else:
        raise EngramTableError(
            f"Engram table tensor {name!r}: expected F8_E4M3 [rows, {head_dim}] (FP8) or "
            f"U8/I8 [rows, {head_dim // 2}] (MXFP4), got {dtype} {shape}"
        )
    expected = [shape[0], fmt.scale_bytes]
    if scale_dtype not in _SCALE_DTYPES or scale_shape != expected:
        raise EngramTableError(
            f"Engram table tensor {scale!r}: expected F8_E8M0 {expected} (one scale per 32 columns "
            f"of {name!r}), got {scale_dtype} {scale_shape}"
        )
    return fmt


@dataclass(frozen=True)
class RowShard:
    """The global rows `[start, stop)` one TP rank owns."""

    start: int
    stop: int

    @property
    def num_rows(self) -> int:
        return self.stop - self.start


def shard_boundaries(num_rows: int, tp_size: int, column_starts: Sequence[int] | None = None) -> list[int]:
    """`tp_size + 1` row boundaries: on column boundaries when the columns divide evenly.

    `column_starts` is `EngramLayerLayout.column_starts()`: `n_columns + 1` values, 0 .. num_rows.
    """
    if tp_size < 1:
        raise Ds41Error(f"Engram table sharding: tp_size must be >= 1, got {tp_size}")
    if column_starts is not None:
        starts = list(column_starts)
        if starts[0] != 0 or starts[-1] != num_rows or starts != sorted(starts):
            raise EngramTableError(
                f"Engram column boundaries must rise from 0 to the table's {num_rows} rows, "
                f"got {starts[0]} .. {starts[-1]} ({len(starts) - 1} columns)"
            )
        n_columns = len(starts) - 1
        if n_columns % tp_size == 0:
            per_rank = n_columns // tp_size
            return starts[::per_rank]
    return [num_rows * r // tp_size for r in range(tp_size + 1)]


def row_shard(
    num_rows: int, tp_rank: int, tp_size: int, column_starts: Sequence[int] | None = None
) -> RowShard:
    if not 0 <= tp_rank < tp_size:
        raise Ds41Error(f"Engram table sharding: tp_rank {tp_rank} not in 0..{tp_size - 1}")
    bounds = shard_boundaries(num_rows, tp_size, column_starts)
    return RowShard(bounds[tp_rank], bounds[tp_rank + 1])


def _host_buffer(rows: int, row_bytes: int, pin: bool | None) -> torch.Tensor:
    pin = torch.cuda.is_available() if pin is None else pin
    return torch.empty((rows, row_bytes), dtype=torch.uint8, pin_memory=pin)


class EngramTable:
    """This rank's rows of one Engram layer's table, packed as in `gather.py`."""

    def __init__(self, packed: torch.Tensor, fmt: TableFormat, shard: RowShard, num_rows: int, name: str):
        if packed.dtype != torch.uint8 or tuple(packed.shape) != (shard.num_rows, fmt.row_bytes):
            raise EngramTableError(
                f"{name}: packed rows must be uint8 [{shard.num_rows}, {fmt.row_bytes}], "
                f"got {packed.dtype} {list(packed.shape)}"
            )
        self.packed = packed
        self.fmt = fmt
        self.shard = shard
        self.num_rows = num_rows
        self.name = name

    def __repr__(self) -> str:
        return (
            f"EngramTable({self.name!r}, {self.fmt.quant.value}, rows {self.shard.start}:{self.shard.stop} "
            f"of {self.num_rows}, {self.nbytes / 2**20:.1f} MiB)"
        )

    @property
    def nbytes(self) -> int:
        return self.packed.numel()

    # ---- construction -------------------------------------------------------------------

    @classmethod
    def from_tensors(
        cls,
        weight: torch.Tensor,
        scale: torch.Tensor,
        column_starts: Sequence[int] | None = None,
        tp_rank: int = 0,
        tp_size: int = 1,
        name: str = "engram.embed",
        pin: bool | None = None,
        head_dim: int = HEAD_DIM,
    ) -> EngramTable:
        """From in-memory `embed.weight` / `embed.scale` tensors (tests, converters)."""
        fmt = detect_format(
            f"{name}.weight", weight.dtype, weight.shape, f"{name}.scale", scale.dtype, scale.shape, head_dim
        )
        shard = row_shard(weight.shape[0], tp_rank, tp_size, column_starts)
        packed = _host_buffer(shard.num_rows, fmt.row_bytes, pin)
        pack_rows(weight[shard.start : shard.stop], scale[shard.start : shard.stop], out=packed)
        return cls(packed, fmt, shard, weight.shape[0], name)

    @classmethod
    def from_safetensors(
        cls,
        paths: str | os.PathLike | Sequence[str | os.PathLike],
        prefix: str,
        column_starts: Sequence[int] | None = None,
        tp_rank: int = 0,
        tp_size: int = 1,
        pin: bool | None = None,
        head_dim: int = HEAD_DIM,
        chunk_rows: int = LOAD_CHUNK_ROWS,
    ) -> EngramTable:
        """Load rows of `{prefix}.embed.weight` / `.scale` (e.g. prefix `layers.1.engram`).

        `paths`: one file, several shard files, or a checkpoint directory (its
        `model.safetensors.index.json` is used when present). The files are memory-mapped and
        only this rank's rows are read.
        """
        from safetensors import safe_open

        wname, sname = weight_name(prefix), scale_name(prefix)
        files = _locate(paths, [wname, sname], nvfp4_hint=f"{prefix}.embed.weight_scale")
        with safe_open(files[wname], framework="pt") as wf, safe_open(files[sname], framework="pt") as sf:
            wslice, sslice = wf.get_slice(wname), sf.get_slice(sname)
            wshape, sshape = wslice.get_shape(), sslice.get_shape()
            fmt = detect_format(
                wname, wslice.get_dtype(), wshape, sname, sslice.get_dtype(), sshape, head_dim
            )
            num_rows = wshape[0]
            shard = row_shard(num_rows, tp_rank, tp_size, column_starts)
            packed = _host_buffer(shard.num_rows, fmt.row_bytes, pin)
            for a in range(shard.start, shard.stop, chunk_rows):
                b = min(a + chunk_rows, shard.stop)
                pack_rows(wslice[a:b], sslice[a:b], out=packed[a - shard.start : b - shard.start])
        return cls(packed, fmt, shard, num_rows, prefix)

    # ---- lookup -------------------------------------------------------------------------

    def owns(self, global_row_ids: torch.Tensor) -> torch.Tensor:
        """Bool mask: which ids this rank serves."""
        return (global_row_ids >= self.shard.start) & (global_row_ids < self.shard.stop)

    def lookup(self, global_row_ids: torch.Tensor) -> torch.Tensor:
        """bf16 `[..., head_dim]` rows for int ids `[...]`, on the ids' device; rows of other
        ranks are zero. CUDA ids use the (untested) Triton kernel when it is available."""
        shape = (*global_row_ids.shape, self.fmt.head_dim)
        if global_row_ids.is_cuda and (self.packed.is_cuda or self.packed.is_pinned()):
            from sglang_ds41.engram import gather_triton

            if gather_triton.available():
                # no range check here: it would synchronise the device; ids outside the
                # shard (including invalid ones) read as zero
                out = gather_triton.gather_dequantize_gpu(
                    self.packed, global_row_ids, self.fmt, self.shard.start, self.shard.num_rows
                )
                return out.view(shape)
        if global_row_ids.numel() and (
            int(global_row_ids.min()) < 0 or int(global_row_ids.max()) >= self.num_rows
        ):
            raise EngramTableError(
                f"{self.name}: row ids must lie in 0..{self.num_rows - 1}, got "
                f"{int(global_row_ids.min())}..{int(global_row_ids.max())}"
            )
        ids = global_row_ids.reshape(-1).to(device=self.packed.device, dtype=torch.int64)
        local = ids - self.shard.start
        if self.shard.num_rows == self.num_rows:
            out = gather_dequantize(self.packed, local, self.fmt)
        else:
            picked = torch.nonzero((local >= 0) & (local < self.shard.num_rows)).squeeze(1)
            out = self.packed.new_zeros((ids.numel(), self.fmt.head_dim), dtype=torch.bfloat16)
            out.index_copy_(0, picked, gather_dequantize(self.packed, local[picked], self.fmt))
        return out.view(shape).to(global_row_ids.device)


def _locate(
    paths: str | os.PathLike | Sequence[str | os.PathLike], names: list[str], nvfp4_hint: str
) -> dict[str, str]:
    """Which file holds each tensor (reads only safetensors headers / the index)."""
    from safetensors import safe_open

    if isinstance(paths, str | os.PathLike):
        root = Path(paths)
        if root.is_dir():
            index = root / "model.safetensors.index.json"
            if index.is_file():
                weight_map = json.loads(index.read_text())["weight_map"]
                found = {n: str(root / weight_map[n]) for n in names if n in weight_map}
                if len(found) == len(names):
                    return found
                candidates = sorted(root / f for f in set(weight_map.values()))
            else:
                candidates = sorted(root.glob("*.safetensors"))
        else:
            candidates = [root]
    else:
        candidates = [Path(p) for p in paths]
    found: dict[str, str] = {}
    seen_hint = False
    for path in candidates:
        if not path.is_file():
            raise EngramTableError(f"Engram table file not found: {path}")
        with safe_open(str(path), framework="pt") as f:
            keys = set(f.keys())
        for n in names:
            if n in keys:
                found.setdefault(n, str(path))
        seen_hint |= nvfp4_hint in keys
    missing = [n for n in names if n not in found]
    if missing:
        why = (
            f" (found {nvfp4_hint!r}: an NVFP4 Engram table, which is not supported — "
            f"expected FP8 or MXFP4 with an E8M0 `.scale`)"
            if seen_hint
            else ""
        )
        raise EngramTableError(
            f"Engram table tensor(s) {missing} not found in {[str(p) for p in candidates]}{why}"
        )
    return found
