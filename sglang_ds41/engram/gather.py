"""Gather + dequantise Engram table rows to bf16 (MODEL.md §5.6 step 1, §8.4).

Storage: each row is kept as one contiguous run of bytes — the quantised values followed by
the row's scale bytes (8 or 16 for the official head_dim of 256):

    FP8   : 256 B of E4M3 + 8 B of E8M0 (one per 32 columns) = 264 B per row
    MXFP4 : 128 B of packed E2M1 (low nibble = even column) + 8 B of E8M0 = 136 B per row
    NVFP4 : 128 B of packed E2M1 + 16 B of E4M3 (one per 16 columns) = 144 B per row, and one
            float32 global scale per table (`TableFormat.global_scale`)

so a lookup is one `index_select` of whole rows (one random memory access per row, not two)
followed by a decode that touches only the gathered bytes.

The decode folds the scale into the lookup table: for a (scale byte, value byte) pair the
result is fixed, so a 256 x 256 table gives the finished bf16 value(s) in one gather — no
separate bf16 multiply, which on CPU costs as much as the gather itself. Every entry is
computed in float64 and rounded once to bf16; since e2m1 / e4m3 values have at most 4
significant bits, `value * 2**(scale - 127)` is exact in bf16 except where it overflows or
leaves bf16's subnormal range, i.e. the same result as dequantising in fp32 and casting. NVFP4
entries are formed as its decoders form them (`formats.dequantize_nvfp4`): the float32 product
of the E4M3 scale and the table's global scale, times the E2M1 value in float32, then rounded
to bf16, so a lookup equals that dequantisation bit for bit. The global scale makes an NVFP4
table's decode table its own (cached per value).
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass
from functools import cache

import torch

from sglang_ds41.engram.layout import HEAD_DIM
from sglang_ds41.errors import Ds41Error
from sglang_ds41.formats import sizes

SCALE_BLOCK = sizes.scale_block("mxfp4")  # columns per E8M0 scale (FP8, MXFP4); head_dim is a multiple

E2M1_MAGNITUDES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)


class Quant(enum.Enum):
    FP8 = "fp8"  # E4M3 values, one byte each; E8M0 per 32
    MXFP4 = "mxfp4"  # E2M1 codes, two per byte; E8M0 per 32
    NVFP4 = "nvfp4"  # E2M1 codes, two per byte; E4M3 per 16, float32 per table


@dataclass(frozen=True)
class TableFormat:
    """How one table row is stored: `value_bytes` of values, then `scale_bytes` scales; NVFP4
    tables also carry their float32 `global_scale` (``weight_scale_2``)."""

    quant: Quant
    head_dim: int = HEAD_DIM
    global_scale: float | None = None

    def __post_init__(self) -> None:
        if self.head_dim <= 0 or self.head_dim % SCALE_BLOCK:
            raise Ds41Error(
                f"Engram head_dim must be a positive multiple of {SCALE_BLOCK}, got {self.head_dim}"
            )
        nvfp4, ws2 = self.quant is Quant.NVFP4, self.global_scale
        if nvfp4 != (ws2 is not None):
            need = "needs its float32 global scale" if nvfp4 else "has no global scale"
            raise Ds41Error(f"Engram {self.quant.value} table format {need}, got global_scale={ws2!r}")
        if ws2 is not None and not (math.isfinite(ws2) and ws2 >= 0):
            raise Ds41Error(f"NVFP4 Engram table: global scale must be finite and >= 0, got {ws2!r}")

    @property
    def scale_block(self) -> int:
        return sizes.scale_block(self.quant.value)

    @property
    def value_bytes(self) -> int:
        return sizes.value_bytes(self.quant.value, self.head_dim)

    @property
    def scale_bytes(self) -> int:
        return sizes.scale_bytes(self.quant.value, self.head_dim)

    @property
    def row_bytes(self) -> int:
        """264 (FP8), 136 (MXFP4) or 144 (NVFP4) for head_dim 256 (`formats.sizes.bytes_per_row`)."""
        return sizes.bytes_per_row(self.quant.value, self.head_dim)


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
def _decode_table_cpu(quant: Quant, global_scale: float | None = None) -> torch.Tensor:
    """Flat table indexed by `scale_byte * 256 + value_byte`.

    FP8: one bf16 per entry (stored as int16). MXFP4 / NVFP4: the two bf16 values of the byte's
    (low, high) nibbles, stored together as one int32 so that one gather yields both.
    """
    codes = torch.arange(256)
    nibbles = torch.tensor([e2m1_value(c) for c in range(16)], dtype=torch.float64)
    pairs = torch.stack([nibbles[codes & 15], nibbles[codes >> 4]], dim=-1)  # [256, 2]
    if quant is Quant.NVFP4:
        e4m3 = torch.tensor([e4m3_value(b) for b in range(256)], dtype=torch.float32)
        block_scale = e4m3 * torch.tensor(global_scale, dtype=torch.float32)  # float32, as decoders do
        table = (block_scale[:, None, None] * pairs.float()[None]).to(torch.bfloat16)  # [256, 256, 2]
        return table.contiguous().view(torch.int32).reshape(-1)
    scales = torch.tensor([e8m0_value(s) for s in range(256)], dtype=torch.float64)
    if quant is Quant.FP8:
        values = torch.tensor([e4m3_value(b) for b in range(256)], dtype=torch.float64)
        table = (scales[:, None] * values[None, :]).to(torch.bfloat16)  # [256, 256]
        return table.view(torch.int16).reshape(-1)
    table = (scales[:, None, None] * pairs[None]).to(torch.bfloat16)  # [256, 256, 2]
    return table.contiguous().view(torch.int32).reshape(-1)


_DEVICE_TABLES: dict[tuple[Quant, float | None, torch.device], torch.Tensor] = {}


def decode_table(fmt: TableFormat, device: torch.device) -> torch.Tensor:
    key = (fmt.quant, fmt.global_scale, device)
    if key not in _DEVICE_TABLES:
        _DEVICE_TABLES[key] = _decode_table_cpu(fmt.quant, fmt.global_scale).to(device)
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
    # index = scale_byte * 256 + value_byte; 32 (FP8), 16 (MXFP4) or 8 (NVFP4) value bytes share a scale
    index = rows[:, :nv].to(torch.int32).view(m, nb, nv // nb)
    index |= (rows[:, nv:].to(torch.int32) << 8).unsqueeze(-1)
    torch.index_select(table, 0, index.view(-1), out=out_words.view(-1))


def gather_dequantize(packed: torch.Tensor, rows: torch.Tensor, fmt: TableFormat) -> torch.Tensor:
    """bf16 `[len(rows), head_dim]` for local row indices `rows` (int64, all in range) of `packed`."""
    table = decode_table(fmt, packed.device)
    m = rows.shape[0]
    out = torch.empty((m, fmt.head_dim), dtype=torch.bfloat16, device=packed.device)
    words = out.view(table.dtype)
    for a in range(0, m, GATHER_CHUNK_ROWS):
        b = min(a + GATHER_CHUNK_ROWS, m)
        _decode_into(packed.index_select(0, rows[a:b]), fmt, table, words[a:b])
    return out
