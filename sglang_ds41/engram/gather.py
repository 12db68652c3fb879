"""Gather + dequantise Engram table rows to bf16 (MODEL.md §5.6 step 1, §8.4).

Storage: each row is kept as one contiguous run of bytes — the quantised values followed by
the row's E8M0 scale bytes (one per 32 columns; 8 for the official head_dim of 256):

    FP8   : 256 B of E4M3 + 8 B of E8M0 = 264 B per row
    MXFP4 : 128 B of packed E2M1 (low nibble = even column) + 8 B of E8M0 = 136 B per row

so a lookup is one `index_select` of whole rows (one random memory access per row, not two)
followed by a decode that touches only the gathered bytes.

The decode folds the scale into the lookup table: for a (scale byte, value byte) pair the
result is fixed, so a 256 x 256 table gives the finished bf16 value(s) in one gather — no
separate bf16 multiply, which on CPU costs as much as the gather itself. Every entry is
computed in float64 and rounded once to bf16; since e2m1 / e4m3 values have at most 4
significant bits, `value * 2**(scale - 127)` is exact in bf16 except where it overflows or
leaves bf16's subnormal range, i.e. the same result as dequantising in fp32 and casting.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from functools import cache

import torch

from sglang_ds41.errors import Ds41Error

HEAD_DIM = 256  # values per row of the official tables (engram_head_dim)
SCALE_BLOCK = 32  # columns per E8M0 scale

E2M1_MAGNITUDES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)


class Quant(enum.Enum):
    FP8 = "fp8"  # E4M3 values, one byte each
    MXFP4 = "mxfp4"  # E2M1 codes, two per byte


@dataclass(frozen=True)
class TableFormat:
    """How one table row is stored: `value_bytes` of values, then `scale_bytes` E8M0 scales."""

    quant: Quant
    head_dim: int = HEAD_DIM

    def __post_init__(self) -> None:
        if self.head_dim <= 0 or self.head_dim % SCALE_BLOCK:
            raise Ds41Error(
                f"Engram head_dim must be a positive multiple of {SCALE_BLOCK}, got {self.head_dim}"
            )

    @property
    def value_bytes(self) -> int:
        return self.head_dim if self.quant is Quant.FP8 else self.head_dim // 2

    @property
    def scale_bytes(self) -> int:
        return self.head_dim // SCALE_BLOCK

    @property
    def row_bytes(self) -> int:
        """264 (FP8) or 136 (MXFP4) for head_dim 256."""
        return self.value_bytes + self.scale_bytes


FP8 = TableFormat(Quant.FP8)
MXFP4 = TableFormat(Quant.MXFP4)


def e2m1_value(code: int) -> float:
    """A 4-bit E2M1 code: bit 3 = sign, bits 0-2 index the magnitudes (§8.2)."""
    magnitude = E2M1_MAGNITUDES[code & 7]
    return -magnitude if code & 8 else magnitude


def e4m3_value(byte: int) -> float:
    """An OCP E4M3 (`float8_e4m3fn`) byte: bias 7, no infinities, 0x7F / 0xFF are NaN."""
    sign = -1.0 if byte & 0x80 else 1.0
    exponent = (byte >> 3) & 0xF
    mantissa = byte & 7
    if exponent == 0xF and mantissa == 7:
        return float("nan")
    if exponent == 0:
        return sign * mantissa * 2.0**-9
    return sign * (1 + mantissa / 8) * 2.0 ** (exponent - 7)


def e8m0_value(byte: int) -> float:
    """An E8M0 scale byte: 2**(byte - 127); 0xFF is NaN."""
    return float("nan") if byte == 0xFF else 2.0 ** (byte - 127)


@cache
def _decode_table_cpu(quant: Quant) -> torch.Tensor:
    """Flat table indexed by `scale_byte * 256 + value_byte`.

    FP8: one bf16 per entry (stored as int16). MXFP4: the two bf16 values of the byte's
    (low, high) nibbles, stored together as one int32 so that one gather yields both.
    """
    scales = torch.tensor([e8m0_value(s) for s in range(256)], dtype=torch.float64)
    if quant is Quant.FP8:
        values = torch.tensor([e4m3_value(b) for b in range(256)], dtype=torch.float64)
        table = (scales[:, None] * values[None, :]).to(torch.bfloat16)  # [256, 256]
        return table.view(torch.int16).reshape(-1)
    codes = torch.arange(256)
    nibbles = torch.tensor([e2m1_value(c) for c in range(16)], dtype=torch.float64)
    pairs = torch.stack([nibbles[codes & 15], nibbles[codes >> 4]], dim=-1)  # [256, 2]
    table = (scales[:, None, None] * pairs[None]).to(torch.bfloat16)  # [256, 256, 2]
    return table.contiguous().view(torch.int32).reshape(-1)


_DEVICE_TABLES: dict[tuple[Quant, torch.device], torch.Tensor] = {}


def decode_table(quant: Quant, device: torch.device) -> torch.Tensor:
    key = (quant, device)
    if key not in _DEVICE_TABLES:
        _DEVICE_TABLES[key] = _decode_table_cpu(quant).to(device)
    return _DEVICE_TABLES[key]


def pack_rows(values: torch.Tensor, scales: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """Interleave per-row value bytes `[N, V]` and scale bytes `[N, S]` into `[N, V + S]` uint8.

    Accepts any 1-byte dtype (float8, uint8, int8); only the bits are kept.
    """
    values = values.view(torch.uint8)
    scales = scales.view(torch.uint8)
    n, v = values.shape
    if out is None:
        out = torch.empty((n, v + scales.shape[1]), dtype=torch.uint8, device=values.device)
    out[:, :v] = values
    out[:, v:] = scales
    return out


# Rows decoded per step: keeps the int32 index and the gathered bytes (~5 MB) in cache and
# bounds transient memory for long prefills (393 k rows for 16 k tokens would need ~250 MB at once).
GATHER_CHUNK_ROWS = 8192


def _decode_into(rows: torch.Tensor, fmt: TableFormat, table: torch.Tensor, out_words: torch.Tensor) -> None:
    """Decode packed rows `[m, row_bytes]` into `out_words`, the bf16 output viewed as `table.dtype`."""
    m, nv, nb = rows.shape[0], fmt.value_bytes, fmt.scale_bytes
    # index = scale_byte * 256 + value_byte; 32 (FP8) or 16 (MXFP4) value bytes share a scale
    index = rows[:, :nv].to(torch.int32).view(m, nb, nv // nb)
    index |= (rows[:, nv:].to(torch.int32) << 8).unsqueeze(-1)
    torch.index_select(table, 0, index.view(-1), out=out_words.view(-1))


def dequantize_packed(rows: torch.Tensor, fmt: TableFormat) -> torch.Tensor:
    """Packed rows `[M, row_bytes]` uint8 -> bf16 `[M, head_dim]`."""
    table = decode_table(fmt.quant, rows.device)
    out = torch.empty((rows.shape[0], fmt.head_dim), dtype=torch.bfloat16, device=rows.device)
    _decode_into(rows, fmt, table, out.view(table.dtype))
    return out


def gather_dequantize(packed: torch.Tensor, rows: torch.Tensor, fmt: TableFormat) -> torch.Tensor:
    """bf16 `[len(rows), head_dim]` for local row indices `rows` (int64, all in range) of `packed`."""
    table = decode_table(fmt.quant, packed.device)
    m = rows.shape[0]
    out = torch.empty((m, fmt.head_dim), dtype=torch.bfloat16, device=packed.device)
    words = out.view(table.dtype)
    for a in range(0, m, GATHER_CHUNK_ROWS):
        b = min(a + GATHER_CHUNK_ROWS, m)
        _decode_into(packed.index_select(0, rows[a:b]), fmt, table, words[a:b])
    return out
