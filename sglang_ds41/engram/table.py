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

Formats (MODEL.md §8.4; detected from the tensors, `detect_format`): FP8 and MXFP4 tables are
`embed.weight` + `embed.scale` (E8M0); NVFP4 tables are ModelOpt-named `embed.weight` +
`embed.weight_scale` (E4M3 per 16 columns) + `embed.weight_scale_2` (the table's one float32,
replicated on every rank; see `formats/nvfp4.py` for the decision). 4-bit codes may be U8 or I8
(third-party MXFP4 releases store I8: the same bytes).
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from sglang_ds41.engram.gather import Quant, TableFormat, gather_dequantize, pack_rows
from sglang_ds41.engram.layout import HEAD_DIM
from sglang_ds41.errors import Ds41Error
from sglang_ds41.formats import sizes

# Rows copied per read while loading a shard: bounds the transient extra memory (~35 MB FP8).
LOAD_CHUNK_ROWS = 1 << 17

_TORCH_TO_ST = {
    torch.float8_e4m3fn: "F8_E4M3",
    torch.float8_e8m0fnu: "F8_E8M0",
    torch.uint8: "U8",
    torch.int8: "I8",
    torch.bfloat16: "BF16",
    torch.float16: "F16",
    torch.float32: "F32",
    torch.float64: "F64",
}
_SCALE_DTYPES = ("F8_E8M0", "U8")  # E8M0 bits; some writers store them as plain bytes
_CODE_DTYPES = ("U8", "I8")  # packed E2M1 pairs; the official layout says U8, some releases I8


class EngramTableError(Ds41Error):
    """An Engram table tensor is missing or has a shape/dtype we cannot serve."""


def weight_name(prefix: str) -> str:
    return f"{prefix}.embed.weight"


def scale_name(prefix: str) -> str:
    return f"{prefix}.embed.scale"


def nvfp4_scale_names(prefix: str) -> tuple[str, str]:
    """NVFP4's (`weight_scale`, `weight_scale_2`) names for a table prefix (`layers.N.engram`)."""
    return f"{prefix}.embed.weight_scale", f"{prefix}.embed.weight_scale_2"


def _st_dtype(dtype: str | torch.dtype) -> str:
    return _TORCH_TO_ST.get(dtype, str(dtype)) if isinstance(dtype, torch.dtype) else dtype


def detect_format(
    name: str,
    dtype: str | torch.dtype,
    shape: Sequence[int],
    scale: str,
    scale_dtype: str | torch.dtype,
    scale_shape: Sequence[int],
    head_dim: int = HEAD_DIM,
    global_scale: float | None = None,
    global_name: str = "weight_scale_2",
) -> TableFormat:
    """FP8 if the weight is E4M3 `[rows, head_dim]`; 4-bit if it is U8/I8 `[rows, head_dim / 2]`,
    MXFP4 with an E8M0 scale `[rows, head_dim / 32]`, NVFP4 with an E4M3 one `[rows, head_dim / 16]`
    (and its float32 `global_scale`).

    With the official head_dim 256 that is width 256 -> FP8, 128 -> 4-bit; anything else fails,
    naming the tensor, what was expected and what was found."""
    dtype, scale_dtype = _st_dtype(dtype), _st_dtype(scale_dtype)
    shape, scale_shape = list(shape), list(scale_shape)
    width = shape[1] if len(shape) == 2 else None
    fp8_width, fp4_width = sizes.value_bytes("fp8", head_dim), sizes.value_bytes("mxfp4", head_dim)
    if width == fp8_width and dtype == "F8_E4M3":
        quant = Quant.FP8
    elif width == fp4_width and dtype in _CODE_DTYPES:
        quant = Quant.NVFP4 if scale_dtype == "F8_E4M3" else Quant.MXFP4
    else:
        raise EngramTableError(
            f"Engram table tensor {name!r}: expected F8_E4M3 [rows, {fp8_width}] (FP8) or "
            f"U8/I8 [rows, {fp4_width}] (MXFP4, NVFP4), got {dtype} {shape}"
        )
    if quant is Quant.NVFP4:
        expected = [shape[0], sizes.scale_bytes("nvfp4", head_dim)]
        if scale_shape != expected:
            raise EngramTableError(
                f"Engram table tensor {scale!r}: expected F8_E4M3 {expected} (NVFP4: one E4M3 scale per "
                f"{sizes.scale_block('nvfp4')} columns of {name!r}), got {scale_dtype} {scale_shape}"
            )
        if global_scale is None or not (math.isfinite(global_scale) and global_scale >= 0):
            raise EngramTableError(
                f"Engram table tensor {global_name!r}: expected the NVFP4 table's finite float32 global "
                f"scale (>= 0), got {global_scale!r}"
            )
        return TableFormat(quant, head_dim, float(global_scale))
    fmt = TableFormat(quant, head_dim)
    expected = [shape[0], fmt.scale_bytes]
    if scale_dtype not in _SCALE_DTYPES or scale_shape != expected:
        raise EngramTableError(
            f"Engram table tensor {scale!r}: expected F8_E8M0 {expected} (one scale per "
            f"{fmt.scale_block} columns of {name!r}), got {scale_dtype} {scale_shape}"
        )
    return fmt


def read_global_scale(tensor: torch.Tensor, name: str) -> float:
    """NVFP4's `weight_scale_2`: a float32 scalar, stored 0-d or as [1] (MODEL.md §12 item 2)."""
    if tensor.dtype != torch.float32 or tensor.numel() != 1 or tensor.dim() > 1:
        raise EngramTableError(
            f"Engram table tensor {name!r}: expected F32 [] (the NVFP4 table's global scale), got "
            f"{_st_dtype(tensor.dtype)} {list(tensor.shape)}"
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


def _host_buffer(rows: int, row_bytes: int, pin: bool | None) -> torch.Tensor:
    pin = torch.cuda.is_available() if pin is None else pin
    return torch.empty((rows, row_bytes), dtype=torch.uint8, pin_memory=pin)


class EngramTable:
    """This rank's rows of one Engram layer's table, packed as in `gather.py`."""

    def __init__(
        self,
        packed: torch.Tensor,
        fmt: TableFormat,
        shard: RowShard,
        num_rows: int,
        name: str,
        tensor_names: tuple[str, ...] = (),
    ):
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
        self.tensor_names = tensor_names  # the checkpoint tensors it was read from

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
        global_scale: torch.Tensor | float | None = None,
    ) -> EngramTable:
        """From in-memory `embed.weight` / `embed.scale` tensors (tests, converters); for NVFP4
        `scale` is `embed.weight_scale` and `global_scale` is `embed.weight_scale_2`."""
        nvfp4 = scale.dtype == torch.float8_e4m3fn
        sname = f"{name}.weight_scale" if nvfp4 else f"{name}.scale"
        if isinstance(global_scale, torch.Tensor):
            global_scale = read_global_scale(global_scale, f"{name}.weight_scale_2")
        fmt = detect_format(
            f"{name}.weight", weight.dtype, weight.shape, sname, scale.dtype, scale.shape, head_dim,
            global_scale, f"{name}.weight_scale_2",
        )  # fmt: skip
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
        """Load rows of `{prefix}.embed.weight` + `.scale` (FP8, MXFP4) or + `.weight_scale` and
        `.weight_scale_2` (NVFP4), e.g. prefix `layers.1.engram`.

        `paths`: one file, several shard files, or a checkpoint directory (its
        `model.safetensors.index.json` is used when present). The files are memory-mapped and
        only this rank's rows are read.
        """
        from safetensors import safe_open

        wname, mx_scale = weight_name(prefix), scale_name(prefix)
        nv_scale, nv_global = nvfp4_scale_names(prefix)
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
            packed = _host_buffer(shard.num_rows, fmt.row_bytes, pin)
            for a in range(shard.start, shard.stop, chunk_rows):
                b = min(a + chunk_rows, shard.stop)
                pack_rows(wslice[a:b], sslice[a:b], out=packed[a - shard.start : b - shard.start])
        return cls(packed, fmt, shard, num_rows, prefix, names)

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
