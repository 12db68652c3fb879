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

Formats: FP8, MXFP4 or NVFP4, detected from the tensors (`detect_format`) by the parts, dtypes
and widths `formats.engram` declares (MODEL.md §8.4). The rows are kept as the checkpoint
stores them, a values array and a scales array (`gather.py`); NVFP4's float32 global scale is
one per table, replicated on every rank.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from sglang_ds41.engram.gather import TableFormat, gather_dequantize
from sglang_ds41.engram.layout import HEAD_DIM
from sglang_ds41.errors import Ds41Error
from sglang_ds41.formats.engram import (
    ENGRAM_FORMATS,
    FP8,
    MXFP4,
    NVFP4,
    Part,
    st_dtype,
    tensor_name,
)

# Rows copied per read while loading a shard: bounds the transient extra memory (~35 MB FP8).
LOAD_CHUNK_ROWS = 1 << 17


class EngramTableError(Ds41Error):
    """An Engram table tensor is missing or has a shape/dtype we cannot serve."""


def _spelled(part: Part) -> str:
    return "/".join(part.accepted)


def detect_format(
    name: str,
    dtype: str | torch.dtype,
    shape: Sequence[int],
    scale: str,
    scale_dtype: str | torch.dtype,
    scale_shape: Sequence[int],
    head_dim: int = HEAD_DIM,
    global_scale: float | None = None,
    global_name: str = NVFP4.global_scale.name,
) -> TableFormat:
    """The format whose values part the weight matches (FP8: E4M3 `[rows, head_dim]`; 4-bit: U8/I8
    `[rows, head_dim / 2]`), then among those the one whose scales part the scale matches (MXFP4:
    E8M0 `[rows, head_dim / 32]`, NVFP4: E4M3 `[rows, head_dim / 16]` and its float32
    `global_scale`); `formats.engram` says which is which.

    Anything else fails, naming the tensor, what was expected and what was found."""
    dtype, scale_dtype = st_dtype(dtype), st_dtype(scale_dtype)
    shape, scale_shape = list(shape), list(scale_shape)
    width = shape[1] if len(shape) == 2 else None
    by_values = [
        f for f in ENGRAM_FORMATS.values() if dtype in f.values.accepted and width == f.value_bytes(head_dim)
    ]
    if not by_values:
        kinds: dict[str, list[str]] = {}
        for f in ENGRAM_FORMATS.values():
            spec = f"{_spelled(f.values)} [rows, {f.value_bytes(head_dim)}]"
            kinds.setdefault(spec, []).append(f.name.upper())
        expected = " or ".join(f"{spec} ({', '.join(names)})" for spec, names in kinds.items())
        raise EngramTableError(f"Engram table tensor {name!r}: expected {expected}, got {dtype} {shape}")
    fmt = next((f for f in by_values if scale_dtype in f.scales.accepted), by_values[0])
    expected = [shape[0], fmt.scale_bytes(head_dim)]
    if scale_dtype not in fmt.scales.accepted or scale_shape != expected:
        raise EngramTableError(
            f"Engram table tensor {scale!r}: expected {fmt.scales.dtype} {expected} ({fmt.name.upper()}: "
            f"one {fmt.scales.element} scale per {fmt.scale_block} columns of {name!r}), "
            f"got {scale_dtype} {scale_shape}"
        )
    if fmt.global_scale is None:
        return TableFormat(fmt, head_dim)
    if global_scale is None or not (math.isfinite(global_scale) and global_scale >= 0):
        raise EngramTableError(
            f"Engram table tensor {global_name!r}: expected the {fmt.name.upper()} table's finite float32 "
            f"global scale (>= 0), got {global_scale!r}"
        )
    return TableFormat(fmt, head_dim, float(global_scale))


def read_global_scale(tensor: torch.Tensor, name: str) -> float:
    """NVFP4's `weight_scale_2`: a float32 scalar, stored 0-d or as [1] (MODEL.md §12 item 2)."""
    part = NVFP4.global_scale
    if tensor.dtype not in part.torch_dtypes() or tensor.numel() != 1 or tensor.dim() > 1:
        raise EngramTableError(
            f"Engram table tensor {name!r}: expected {part.dtype} [] (the NVFP4 table's global scale), got "
            f"{st_dtype(tensor.dtype)} {list(tensor.shape)}"
        )
    return float(tensor.reshape(()))


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


def _host_buffer(rows: int, width: int, pin: bool | None) -> torch.Tensor:
    pin = torch.cuda.is_available() if pin is None else pin
    return torch.empty((rows, width), dtype=torch.uint8, pin_memory=pin)


class EngramTable:
    """This rank's rows of one Engram layer's table: the stored `values` and `scales` arrays as
    uint8 (`gather.py`), and the format that reads them."""

    def __init__(
        self,
        values: torch.Tensor,
        scales: torch.Tensor,
        fmt: TableFormat,
        shard: RowShard,
        num_rows: int,
        name: str,
        tensor_names: tuple[str, ...] = (),
    ):
        for what, array, width in (("values", values, fmt.value_bytes), ("scales", scales, fmt.scale_bytes)):
            if array.dtype != torch.uint8 or tuple(array.shape) != (shard.num_rows, width):
                raise EngramTableError(
                    f"{name}: {fmt.format.name} {what} must be uint8 [{shard.num_rows}, {width}], "
                    f"got {array.dtype} {list(array.shape)}"
                )
        self.values = values
        self.scales = scales
        self.fmt = fmt
        self.shard = shard
        self.num_rows = num_rows
        self.name = name
        self.tensor_names = tensor_names  # the checkpoint tensors it was read from

    def __repr__(self) -> str:
        return (
            f"EngramTable({self.name!r}, {self.fmt.format.name}, rows {self.shard.start}:{self.shard.stop} "
            f"of {self.num_rows}, {self.nbytes / 2**20:.1f} MiB)"
        )

    @property
    def nbytes(self) -> int:
        return self.values.numel() + self.scales.numel()

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
        global_scale: torch.Tensor | float | None = None,
    ) -> EngramTable:
        """From in-memory `embed.weight` / `embed.scale` tensors (tests, converters); for NVFP4
        `scale` is `embed.weight_scale` and `global_scale` is `embed.weight_scale_2`."""
        fmt_of_scale = NVFP4 if st_dtype(scale.dtype) in NVFP4.scales.accepted else MXFP4
        sname, gname = (f"{name}.{part.name}" for part in (fmt_of_scale.scales, NVFP4.global_scale))
        if isinstance(global_scale, torch.Tensor):
            global_scale = read_global_scale(global_scale, gname)
        fmt = detect_format(
            f"{name}.{FP8.values.name}", weight.dtype, weight.shape, sname, scale.dtype, scale.shape,
            head_dim, global_scale, gname,
        )  # fmt: skip
        shard = row_shard(weight.shape[0], tp_rank, tp_size, column_starts)
        values = _host_buffer(shard.num_rows, fmt.value_bytes, pin)
        scales = _host_buffer(shard.num_rows, fmt.scale_bytes, pin)
        values.copy_(weight[shard.start : shard.stop].view(torch.uint8))
        scales.copy_(scale[shard.start : shard.stop].view(torch.uint8))
        return cls(values, scales, fmt, shard, weight.shape[0], name)

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
        """Load rows of `{prefix}.embed.weight` + `.scale` (FP8, MXFP4) or + `.weight_scale` and
        `.weight_scale_2` (NVFP4), e.g. prefix `layers.1.engram`.

        `paths`: one file, several shard files, or a checkpoint directory (its
        `model.safetensors.index.json` is used when present). The files are memory-mapped and
        only this rank's rows are read.
        """
        from safetensors import safe_open

        wname = tensor_name(prefix, FP8.values)
        mx_scale, nv_scale, nv_global = (tensor_name(prefix, p) for p in (MXFP4.scales, *NVFP4.parts[1:]))
        files = _locate(paths, [wname], [mx_scale, nv_scale, nv_global])
        sname, names = _scale_of(files, wname, mx_scale, nv_scale, nv_global)
        global_scale = None
        if nv_global in names:
            with safe_open(files[nv_global], framework="pt") as gf:
                global_scale = read_global_scale(gf.get_tensor(nv_global), nv_global)
        with safe_open(files[wname], framework="pt") as wf, safe_open(files[sname], framework="pt") as sf:
            wslice, sslice = wf.get_slice(wname), sf.get_slice(sname)
            wshape, sshape = wslice.get_shape(), sslice.get_shape()
            fmt = detect_format(
                wname, wslice.get_dtype(), wshape, sname, sslice.get_dtype(), sshape, head_dim,
                global_scale, nv_global,
            )  # fmt: skip
            num_rows = wshape[0]
            shard = row_shard(num_rows, tp_rank, tp_size, column_starts)
            values = _host_buffer(shard.num_rows, fmt.value_bytes, pin)
            scales = _host_buffer(shard.num_rows, fmt.scale_bytes, pin)
            for a in range(shard.start, shard.stop, chunk_rows):
                b = min(a + chunk_rows, shard.stop)
                here = slice(a - shard.start, b - shard.start)
                values[here] = wslice[a:b].view(torch.uint8)
                scales[here] = sslice[a:b].view(torch.uint8)
        return cls(values, scales, fmt, shard, num_rows, prefix, names)

    # ---- lookup -------------------------------------------------------------------------

    def owns(self, global_row_ids: torch.Tensor) -> torch.Tensor:
        """Bool mask: which ids this rank serves."""
        return (global_row_ids >= self.shard.start) & (global_row_ids < self.shard.stop)

    def lookup(self, global_row_ids: torch.Tensor) -> torch.Tensor:
        """bf16 `[..., head_dim]` rows for int ids `[...]`, on the ids' device; rows of other
        ranks are zero."""
        shape = (*global_row_ids.shape, self.fmt.head_dim)
        if global_row_ids.numel() and (
            int(global_row_ids.min()) < 0 or int(global_row_ids.max()) >= self.num_rows
        ):
            raise EngramTableError(
                f"{self.name}: row ids must lie in 0..{self.num_rows - 1}, got "
                f"{int(global_row_ids.min())}..{int(global_row_ids.max())}"
            )
        ids = global_row_ids.reshape(-1).to(device=self.values.device, dtype=torch.int64)
        local = ids - self.shard.start
        if self.shard.num_rows == self.num_rows:
            out = gather_dequantize(self.values, self.scales, local, self.fmt)
        else:
            picked = torch.nonzero((local >= 0) & (local < self.shard.num_rows)).squeeze(1)
            out = self.values.new_zeros((ids.numel(), self.fmt.head_dim), dtype=torch.bfloat16)
            out.index_copy_(0, picked, gather_dequantize(self.values, self.scales, local[picked], self.fmt))
        return out.view(shape).to(global_row_ids.device)


def _scale_of(
    files: dict[str, str], wname: str, mx_scale: str, nv_scale: str, nv_global: str
) -> tuple[str, tuple[str, ...]]:
    """(the scale tensor to read, every tensor of the table): which scales the table has."""
    where = sorted({files[wname]} | {files[n] for n in (mx_scale, nv_scale, nv_global) if n in files})
    if mx_scale in files and (nv_scale in files or nv_global in files):
        raise EngramTableError(
            f"Engram table {wname!r} has both an MXFP4/FP8 scale {mx_scale!r} and NVFP4 scales "
            f"({nv_scale!r}, {nv_global!r}) in {where}; expected one of the two"
        )
    if mx_scale in files:
        return mx_scale, (wname, mx_scale)
    if nv_scale in files and nv_global in files:
        return nv_scale, (wname, nv_scale, nv_global)
    if nv_scale in files or nv_global in files:
        have, lack = (nv_scale, nv_global) if nv_scale in files else (nv_global, nv_scale)
        raise EngramTableError(
            f"Engram table tensor {lack!r} not found in {where}: an NVFP4 table needs it beside {have!r}"
        )
    raise EngramTableError(
        f"Engram table tensor {mx_scale!r} (FP8, MXFP4) or {nv_scale!r} + {nv_global!r} (NVFP4) not found "
        f"in {where}, beside {wname!r}"
    )


def _locate(
    paths: str | os.PathLike | Sequence[str | os.PathLike], required: list[str], optional: list[str]
) -> dict[str, str]:
    """Which file holds each tensor present (reads only safetensors headers / the index); every
    `required` one must exist."""
    from safetensors import safe_open

    names = required + optional
    if isinstance(paths, str | os.PathLike):
        root = Path(paths)
        if root.is_dir():
            index = root / "model.safetensors.index.json"
            if index.is_file():
                weight_map = json.loads(index.read_text())["weight_map"]
                found = {n: str(root / weight_map[n]) for n in names if n in weight_map}
                if all(n in found for n in required):
                    return found
                candidates = sorted(root / f for f in set(weight_map.values()))
            else:
                candidates = sorted(root.glob("*.safetensors"))
        else:
            candidates = [root]
    else:
        candidates = [Path(p) for p in paths]
    found = {}
    for path in candidates:
        if not path.is_file():
            raise EngramTableError(f"Engram table file not found: {path}")
        with safe_open(str(path), framework="pt") as f:
            keys = set(f.keys())
        for n in names:
            if n in keys:
                found.setdefault(n, str(path))
    missing = [n for n in required if n not in found]
    if missing:
        where = [str(p) for p in candidates]
        raise EngramTableError(f"Engram table tensor(s) {missing} not found in {where}")
    return found
