"""The model's KV fake-quantisers (MODEL.md §4.2, §4.4, §4.5): part of V4.1's numerics, not an
optional compression. Each has a storage form (what a quantised cache holds) and a fake-quant form
(quantise + dequantise, back in the input dtype) for references that store bf16.

* window KV: FP8 E4M3, blocks of 32, ``s = 2**ceil(log2(max(amax, 1e-4) / 448))``; 528 B per 512.
* compressed latents: E2M1, blocks of 16, ``s = e4m3_rne(clamp(amax / 6, 2**-9, 448))``,
  values ``e2m1_rne(clamp(x / s, -6, 6)) * s``; zero blocks stay zero; 288 B per 512.
* index keys / queries: E2M1, blocks of 32, ``s = 2**ceil(log2(max(amax, 6 * 2**-126) / 6))``;
  68 B per 128 (same storage layout as MXFP4, different scale rule).

The fake-quant forms pass gradients straight through (`straight_through`), so the model can be
trained with the quantisers in its forward; their values are unchanged.
"""

from __future__ import annotations

import torch

from sglang_ds41.formats.straight_through import straight_through

from . import e2m1, e8m0
from .checks import require_float, require_multiple, require_shape
from .fp8 import as_e4m3, dequantize_fp8_rows, quantize_fp8_rows, to_e4m3
from .mxfp4 import dequantize_mxfp4

WINDOW_BLOCK = 32
WINDOW_AMAX_FLOOR = 1e-4
LATENT_BLOCK = 16
LATENT_SCALE_MIN = 2.0**-9  # smallest positive E4M3 (subnormal)
INDEX_BLOCK = 32
INDEX_AMAX_FLOOR = 6.0 * 2.0**-126


def quantize_window_fp8(kv: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """kv [..., D] -> (float8_e4m3fn [..., D], float8_e8m0fnu [..., D/32])."""
    return quantize_fp8_rows(kv, WINDOW_BLOCK, amax_floor=WINDOW_AMAX_FLOOR)


@straight_through
def fake_quant_window_fp8(kv: torch.Tensor) -> torch.Tensor:
    values, scales = quantize_window_fp8(kv)
    return dequantize_fp8_rows(values, scales, WINDOW_BLOCK, dtype=kv.dtype)


def quantize_latent_fp4(c: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """c [..., D] -> (packed E2M1 uint8 [..., D/2], float8_e4m3fn scales [..., D/16])."""
    require_float(c, "fp4 latent")
    d = c.shape[-1]
    require_multiple(d, LATENT_BLOCK, "fp4 latent")
    blocks = c.float().reshape(*c.shape[:-1], d // LATENT_BLOCK, LATENT_BLOCK)
    amax = blocks.abs().amax(dim=-1)
    scale = to_e4m3(torch.clamp(amax / e2m1.MAX, LATENT_SCALE_MIN, 448.0))
    # The clamp to +-6 of the spec is the encoder's saturation.
    codes = e2m1.encode(blocks / scale.float().unsqueeze(-1))
    return e2m1.pack(codes.reshape(c.shape)), scale


def dequantize_latent_fp4(
    packed: torch.Tensor, scales: torch.Tensor, dtype: torch.dtype = torch.bfloat16
) -> torch.Tensor:
    values = e2m1.decode_packed(packed)
    d = values.shape[-1]
    require_multiple(d, LATENT_BLOCK, "fp4 latent codes", dim="unpacked last dim")
    s = as_e4m3(scales, "fp4 latent scales").float()
    require_shape(s, (*values.shape[:-1], d // LATENT_BLOCK), "fp4 latent scales")
    out = values.reshape(*values.shape[:-1], d // LATENT_BLOCK, LATENT_BLOCK) * s.unsqueeze(-1)
    return out.reshape(values.shape).to(dtype)


@straight_through
def fake_quant_latent_fp4(c: torch.Tensor) -> torch.Tensor:
    packed, scales = quantize_latent_fp4(c)
    return dequantize_latent_fp4(packed, scales, dtype=c.dtype)


def quantize_index_fp4(k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """k [..., D] -> (packed E2M1 uint8 [..., D/2], float8_e8m0fnu scales [..., D/32])."""
    require_float(k, "fp4 index")
    d = k.shape[-1]
    require_multiple(d, INDEX_BLOCK, "fp4 index")
    blocks = k.float().reshape(*k.shape[:-1], d // INDEX_BLOCK, INDEX_BLOCK)
    amax = blocks.abs().amax(dim=-1)
    exp = e8m0.ceil_scale_exponent(amax, e2m1.MAX, INDEX_AMAX_FLOOR)
    codes = e2m1.encode(blocks * e8m0.pow2(-exp).unsqueeze(-1))
    return e2m1.pack(codes.reshape(k.shape)), e8m0.encode(exp, ~torch.isfinite(amax))


@straight_through
def fake_quant_index_fp4(k: torch.Tensor) -> torch.Tensor:
    packed, scales = quantize_index_fp4(k)
    return dequantize_mxfp4(packed, scales, dtype=k.dtype)
