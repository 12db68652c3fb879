"""Byte layouts of the stored attention state: the model's own KV quantisers, kept packed.

Every row the slot store keeps is already the output of a V4.1 fake-quantiser (MODEL.md §4.2,
§4.4, §4.5), so storing its codes instead of the dequantised floats loses nothing, and the
store costs what the model was designed for (§4.6):

* window KV: FP8 E4M3 + one UE8M0 scale per 32      (512 + 16 = 528 B per row of 512);
* compressed latents: E2M1 pairs + one E4M3 per 16  (256 + 32 = 288 B per row of 512);
* index keys: E2M1 pairs + one UE8M0 per 32          (64 + 4 = 68 B per row of 128).

A row is one `uint8` vector: codes first, then scales; `decode(encode(x))` is the model's
fake-quantiser of `x`, computed the same way. The window and index-key rules (power-of-two
scales) are idempotent, so the store may encode the rows the model already fake-quantised; the
latent rule (E4M3 scales, coarse when subnormal) is not, so latents are encoded from the
quantiser's input (`model.attention.NewEntries.rotated`, handed to `SlotState.commit`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from sglang_ds41.formats.fp8 import dequantize_fp8_rows
from sglang_ds41.formats.kv_quant import (
    INDEX_BLOCK,
    LATENT_BLOCK,
    WINDOW_BLOCK,
    dequantize_latent_fp4,
    quantize_index_fp4,
    quantize_latent_fp4,
    quantize_window_fp8,
)
from sglang_ds41.formats.mxfp4 import dequantize_mxfp4


def _bytes(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view(torch.uint8)


@dataclass(frozen=True)
class RowCodec:
    """How rows of `dim` values are packed into `code_bytes + scale_bytes` bytes."""

    name: str
    dim: int
    code_bytes: int
    scale_bytes: int
    _quantize: Callable[[torch.Tensor], tuple[torch.Tensor, torch.Tensor]]
    _dequantize: Callable[[torch.Tensor, torch.Tensor, torch.dtype], torch.Tensor]

    @property
    def row_bytes(self) -> int:
        return self.code_bytes + self.scale_bytes

    def encode(self, rows: torch.Tensor) -> torch.Tensor:
        """[N, dim] floats -> [N, row_bytes] uint8."""
        codes, scales = self._quantize(rows)
        return torch.cat([_bytes(codes), _bytes(scales)], dim=-1)

    def decode(self, packed: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        """[N, row_bytes] uint8 -> [N, dim] in `dtype`."""
        return self._dequantize(packed[:, : self.code_bytes], packed[:, self.code_bytes :], dtype)


def _window_rows(codes: torch.Tensor, scales: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    return dequantize_fp8_rows(codes.view(torch.float8_e4m3fn), scales, WINDOW_BLOCK, dtype=dtype)


def _latent_rows(codes: torch.Tensor, scales: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    return dequantize_latent_fp4(codes, scales.view(torch.float8_e4m3fn), dtype=dtype)


def _index_rows(codes: torch.Tensor, scales: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    return dequantize_mxfp4(codes, scales, dtype=dtype)  # same bytes as MXFP4, another scale rule


def window_codec(dim: int) -> RowCodec:
    return RowCodec("window KV", dim, dim, dim // WINDOW_BLOCK, quantize_window_fp8, _window_rows)


def latent_codec(dim: int) -> RowCodec:
    return RowCodec("latent", dim, dim // 2, dim // LATENT_BLOCK, quantize_latent_fp4, _latent_rows)


def index_codec(dim: int) -> RowCodec:
    return RowCodec("index key", dim, dim // 2, dim // INDEX_BLOCK, quantize_index_fp4, _index_rows)
