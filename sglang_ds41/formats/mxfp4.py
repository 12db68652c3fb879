"""MXFP4 (OCP Microscaling): E2M1 codes, two per byte, one E8M0 scale per 32 consecutive values.

Scale choice follows the OCP MX v1.0 spec: shared exponent ``floor(log2(amax)) - 2`` (2 = emax of
E2M1), clamped to the E8M0 range; elements are then rounded to E2M1 with ties to even and
saturated to +-6. The spec's choice keeps the block's largest element in E2M1's top binade, so
values in [6, 8) * 2**e saturate to 6 * 2**e (a deliberate clip, not a bug).

All-zero blocks get scale byte 0 (2**-127: the clamp of floor(log2 0) = -inf); blocks holding
NaN or inf get the NaN scale byte 255, so they dequantise to NaN.
"""

from __future__ import annotations

import torch

from . import e2m1, e8m0
from .checks import require_float, require_multiple, require_shape
from .fp8 import dequantize_fp8_rows

BLOCK = 32
E2M1_EMAX = 2


def quantize_mxfp4(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x [..., K] -> (codes uint8 [..., K/2], scales float8_e8m0fnu [..., K/32])."""
    require_float(x, "mxfp4")
    k = x.shape[-1]
    require_multiple(k, BLOCK, "mxfp4")
    blocks = x.float().reshape(*x.shape[:-1], k // BLOCK, BLOCK)
    amax = blocks.abs().amax(dim=-1)
    usable = torch.isfinite(amax) & (amax > 0)
    exp = e8m0.floor_log2(torch.where(usable, amax, torch.ones_like(amax))) - E2M1_EMAX
    exp = torch.where(usable, exp, torch.full_like(exp, e8m0.MIN_EXPONENT))
    exp = exp.clamp(e8m0.MIN_EXPONENT, e8m0.MAX_EXPONENT)
    codes = e2m1.encode(blocks * e8m0.pow2(-exp).unsqueeze(-1))
    return e2m1.pack(codes.reshape(x.shape)), e8m0.encode(exp, ~torch.isfinite(amax))


def dequantize_mxfp4(
    codes: torch.Tensor, scales: torch.Tensor, dtype: torch.dtype = torch.bfloat16
) -> torch.Tensor:
    """``W[..., j] = e2m1(code[..., j]) * 2**(scale[..., j // 32] - 127)``; codes may be uint8 or int8."""
    values = e2m1.decode(e2m1.unpack(codes))
    k = values.shape[-1]
    require_multiple(k, BLOCK, "mxfp4 codes", dim="unpacked last dim")
    s = e8m0.decode(scales)
    require_shape(s, (*values.shape[:-1], k // BLOCK), "mxfp4 scales")
    out = values.reshape(*values.shape[:-1], k // BLOCK, BLOCK) * s.unsqueeze(-1)
    return out.reshape(values.shape).to(dtype)


def fp8_rows_to_mxfp4(
    values: torch.Tensor, scales: torch.Tensor, block: int = 32
) -> tuple[torch.Tensor, torch.Tensor]:
    """Re-encode FP8 row blocks (e.g. the official Engram table) as MXFP4.

    The FP8 rows are dequantised exactly in float32 first, so the only rounding is MXFP4's own.
    """
    exact = dequantize_fp8_rows(values, scales, block=block, dtype=torch.float32)
    return quantize_mxfp4(exact)
