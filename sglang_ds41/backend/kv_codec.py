"""Byte layouts of the stored attention state: the model's own KV quantisers, kept packed.

Every row the slot store keeps is already the output of a V4.1 fake-quantiser (MODEL.md §4.2,
§4.4, §4.5), so storing its codes instead of the dequantised floats loses nothing, and the
store costs what the model was designed for (§4.6):

* window KV: FP8 E4M3 + one UE8M0 scale per 32      (512 + 16 = 528 B per row of 512);
* compressed latents: E2M1 pairs + one E4M3 per 16  (256 + 32 = 288 B per row of 512);
* index keys: E2M1 pairs + one UE8M0 per 32          (64 + 4 = 68 B per row of 128).

A row is one `uint8` vector: codes first, then scales; `decode(encode(x))` is the model's
fake-quantiser of `x`, computed the same way. The window and index-key rules (power-of-two
scales) are idempotent in what they hold, so the store may encode the rows the model already
fake-quantised (the bytes can differ from those of the rows before: a block's scale one step
apart, its codes shifted to match; they decode to the same rows); the latent rule (E4M3 scales,
coarse when subnormal) is not, so latents are encoded from the quantiser's input
(`model.attention.NewEntries.rotated`, handed to `SlotState.commit`). The backend's forward
hands over the bytes its quantisers packed with the rows (`fast.quant`), so nothing is encoded
twice.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from sglang_ds41.fast import quant
from sglang_ds41.formats.kv_quant import INDEX_BLOCK, LATENT_BLOCK, WINDOW_BLOCK


@dataclass(frozen=True)
class RowCodec:
    """How rows of `dim` values are packed into `code_bytes + scale_bytes` bytes; the packing and
    its compiled loops are `fast.quant`'s (bit for bit the `formats.kv_quant` quantisers)."""

    name: str
    kind: str  # fast.quant.WINDOW / LATENT / INDEX
    dim: int
    code_bytes: int
    scale_bytes: int

    @property
    def row_bytes(self) -> int:
        return self.code_bytes + self.scale_bytes

    def encode(self, rows: torch.Tensor) -> torch.Tensor:
        """[N, dim] floats -> [N, row_bytes] uint8."""
        return quant.QUANTIZERS[self.kind](rows)[1]

    def decode(self, packed: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        """[N, row_bytes] uint8 -> [N, dim] in `dtype`."""
        return quant.decode(packed, self.kind, self.dim, dtype)


def window_codec(dim: int) -> RowCodec:
    return RowCodec("window KV", quant.WINDOW, dim, dim, dim // WINDOW_BLOCK)


def latent_codec(dim: int) -> RowCodec:
    return RowCodec("latent", quant.LATENT, dim, dim // 2, dim // LATENT_BLOCK)


def index_codec(dim: int) -> RowCodec:
    return RowCodec("index key", quant.INDEX, dim, dim // 2, dim // INDEX_BLOCK)
