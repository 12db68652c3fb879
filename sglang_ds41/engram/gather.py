"""Gather + dequantise Engram table rows to bf16 on the CPU (MODEL.md §5.6 step 1, §8.4).

A table is held as the checkpoint stores it (`formats.engram`): a value array (FP8: one E4M3
byte per value; MXFP4 / NVFP4: two E2M1 codes a byte) and a scale array (one scale byte per 32
or 16 values), plus NVFP4's float32 global scale per table. That is also the layout upstream
SGLang and our plugin keep on GPUs (`engram/split_gather.py`), so there is one layout.
A lookup gathers each id's values and scales and decodes only the gathered bytes.

The decode folds the scale into a lookup table: for a (scale byte, value byte) pair the result
is fixed, so a 256 x 256 table gives the finished bf16 value(s) in one gather -- no separate
bf16 multiply, which on CPU costs as much as the gather itself. The table is filled by the
format's own decoder (`EngramFormat.dequantize`, i.e. `formats.fp8` / `mxfp4` / `nvfp4`)
applied once to every pair, so a lookup equals dequantising the rows bit for bit. The global
scale makes an NVFP4 table's decode table its own (cached per value).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cache

import torch

from sglang_ds41.engram.layout import HEAD_DIM
from sglang_ds41.errors import Ds41Error
from sglang_ds41.formats.engram import FP8, EngramFormat


@dataclass(frozen=True)
class TableFormat:
    """One table's storage: its `format`, `head_dim` values per row and, for NVFP4, its float32
    `global_scale` (``weight_scale_2``)."""

    format: EngramFormat
    head_dim: int = HEAD_DIM
    global_scale: float | None = None

    def __post_init__(self) -> None:
        block = self.format.scale_block
        if self.head_dim <= 0 or self.head_dim % block:
            raise Ds41Error(
                f"Engram {self.format.name} head_dim must be a positive multiple of {block}, "
                f"got {self.head_dim}"
            )
        takes_global, ws2 = self.format.global_scale is not None, self.global_scale
        if takes_global != (ws2 is not None):
            need = "needs its float32 global scale" if takes_global else "has no global scale"
            raise Ds41Error(f"Engram {self.format.name} table format {need}, got global_scale={ws2!r}")
        if ws2 is not None and not (math.isfinite(ws2) and ws2 >= 0):
            raise Ds41Error(f"NVFP4 Engram table: global scale must be finite and >= 0, got {ws2!r}")

    @property
    def value_bytes(self) -> int:
        return self.format.value_bytes(self.head_dim)

    @property
    def scale_bytes(self) -> int:
        return self.format.scale_bytes(self.head_dim)

    @property
    def row_bytes(self) -> int:
        """264 (FP8), 136 (MXFP4) or 144 (NVFP4) for head_dim 256."""
        return self.format.bytes_per_row(self.head_dim)


@cache
def _decode_table_cpu(fmt: EngramFormat, global_scale: float | None = None) -> torch.Tensor:
    """Flat table indexed by `scale_byte * 256 + value_byte`, from the format's decoder.

    FP8: one bf16 per entry (stored as int16). MXFP4 / NVFP4: the two bf16 values of the byte's
    (low, high) nibbles, stored together as one int32 so that one gather yields both.
    """
    # every (scale byte, value byte) pair: 256 rows of one block each per scale byte
    per_block = fmt.scale_block if fmt is FP8 else fmt.scale_block // 2  # value bytes per scale
    values = torch.arange(256, dtype=torch.uint8).repeat(256).view(-1, per_block)
    scales = torch.arange(256, dtype=torch.uint8).repeat_interleave(256 // per_block).view(-1, 1)
    values, scales = values.view(fmt.values.torch_dtype()), scales.view(fmt.scales.torch_dtype())
    ws2 = None if global_scale is None else torch.tensor(global_scale, dtype=torch.float32)
    decoded = fmt.dequantize(values, scales, ws2, dtype=torch.bfloat16)
    word = torch.int16 if fmt is FP8 else torch.int32  # one value, or a byte's two
    return decoded.contiguous().view(word).reshape(-1)


_DEVICE_TABLES: dict[tuple[EngramFormat, float | None, torch.device], torch.Tensor] = {}


def decode_table(fmt: TableFormat, device: torch.device) -> torch.Tensor:
    key = (fmt.format, fmt.global_scale, device)
    if key not in _DEVICE_TABLES:
        _DEVICE_TABLES[key] = _decode_table_cpu(fmt.format, fmt.global_scale).to(device)
    return _DEVICE_TABLES[key]


# Rows decoded per step: keeps the int32 index and the gathered bytes (~5 MB) in cache and
# bounds transient memory for long prefills (393 k rows for 16 k tokens would need ~250 MB at once).
GATHER_CHUNK_ROWS = 8192


def gather_dequantize(
    values: torch.Tensor, scales: torch.Tensor, rows: torch.Tensor, fmt: TableFormat
) -> torch.Tensor:
    """bf16 `[len(rows), head_dim]` for local row indices `rows` (int64, all in range) of a table's
    `values` `[n, value_bytes]` and `scales` `[n, scale_bytes]` (uint8 views of the stored bytes)."""
    table = decode_table(fmt, values.device)
    m, nv, nb = rows.shape[0], fmt.value_bytes, fmt.scale_bytes
    out = torch.empty((m, fmt.head_dim), dtype=torch.bfloat16, device=values.device)
    words = out.view(table.dtype)
    for a in range(0, m, GATHER_CHUNK_ROWS):
        picked = rows[a : a + GATHER_CHUNK_ROWS]
        k = picked.shape[0]
        # index = scale_byte * 256 + value_byte; 32 (FP8), 16 (MXFP4) or 8 (NVFP4) value bytes share a scale
        index = values.index_select(0, picked).to(torch.int32).view(k, nb, nv // nb)
        index |= (scales.index_select(0, picked).to(torch.int32) << 8).unsqueeze(-1)
        torch.index_select(table, 0, index.view(-1), out=words[a : a + k].view(-1))
    return out

