"""FP8 E4M3 with E8M0 block scales: 32x32 blocks for linears, 1x32 row blocks for Engram tables.

Scale rule (DeepSeek's ``scale_fmt: ue8m0``): ``s = 2**ceil(log2(amax / 448))`` per block, so
``|x / s| <= 448`` and values are cast to E4M3 with round-to-nearest-even. Dequantisation is
``fp8(value) * s``; both factors are short enough that the float32 product is exact.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from . import e8m0
from .checks import FormatError, require_float, require_multiple, require_shape

E4M3_MAX = 448.0


def to_e4m3(x: torch.Tensor) -> torch.Tensor:
    """float -> float8_e4m3fn, RNE, saturating at +-448 (E4M3fn has no inf; overflow would be NaN)."""
    return x.float().clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn)


def as_e4m3(t: torch.Tensor, what: str = "e4m3 values") -> torch.Tensor:
    """Accept float8_e4m3fn or its raw uint8 bytes."""
    if t.dtype == torch.float8_e4m3fn:
        return t
    if t.dtype == torch.uint8:
        return t.view(torch.float8_e4m3fn)
    raise FormatError(f"{what}: expected dtype float8_e4m3fn or uint8, got {t.dtype}")


def quantize_fp8_rows(
    x: torch.Tensor, block: int = 32, amax_floor: float = 0.0
) -> tuple[torch.Tensor, torch.Tensor]:
    """x [..., K] -> (float8_e4m3fn [..., K], float8_e8m0fnu [..., K/block]).

    Blocks never span rows (the Engram table layout). ``amax_floor`` is the KV window's 1e-4;
    without it an all-zero block gets scale byte 0 (2**-127). A block containing NaN/inf gets
    the NaN scale byte.
    """
    require_float(x, "fp8 rows")
    k = x.shape[-1]
    require_multiple(k, block, "fp8 rows")
    blocks = x.float().reshape(*x.shape[:-1], k // block, block)
    amax = blocks.abs().amax(dim=-1)
    exp = e8m0.ceil_scale_exponent(amax, E4M3_MAX, amax_floor)
    values = to_e4m3(blocks * e8m0.pow2(-exp).unsqueeze(-1))
    return values.reshape(x.shape), e8m0.encode(exp, ~torch.isfinite(amax))


def dequantize_fp8_rows(
    values: torch.Tensor, scales: torch.Tensor, block: int = 32, dtype: torch.dtype = torch.bfloat16
) -> torch.Tensor:
    """Inverse of :func:`quantize_fp8_rows` (scales may be float8_e8m0fnu or uint8)."""
    v = as_e4m3(values, "fp8 rows values")
    if v.dim() == 0:
        raise FormatError("fp8 rows values: expected at least one dimension, got a 0-d tensor")
    k = v.shape[-1]
    require_multiple(k, block, "fp8 rows values")
    s = e8m0.decode(scales)
    require_shape(s, (*v.shape[:-1], k // block), "fp8 rows scales")
    out = v.float().reshape(*v.shape[:-1], k // block, block) * s.unsqueeze(-1)
    return out.reshape(v.shape).to(dtype)


def _block2d_dims(shape: torch.Size, block: int, what: str) -> tuple[int, int, int, int]:
    if len(shape) != 2:
        raise FormatError(f"{what}: expected a 2-D [out, in] tensor, got shape {list(shape)}")
    if block <= 0:
        raise FormatError(f"{what}: block size must be positive, got {block}")
    rows, cols = shape
    return rows, cols, -(-rows // block), -(-cols // block)


def quantize_fp8_block2d(w: torch.Tensor, block: int = 32) -> tuple[torch.Tensor, torch.Tensor]:
    """w [out, in] -> (weight float8_e4m3fn [out, in], scale float8_e8m0fnu [ceil(out/b), ceil(in/b)]).

    Edge blocks that stick out of the matrix are zero-padded, which leaves their amax unchanged.
    """
    require_float(w, "fp8 block2d weight")
    rows, cols, rb, cb = _block2d_dims(w.shape, block, "fp8 block2d weight")
    padded = F.pad(w.float(), (0, cb * block - cols, 0, rb * block - rows))
    blocks = padded.view(rb, block, cb, block)
    amax = blocks.abs().amax(dim=(1, 3))
    exp = e8m0.ceil_scale_exponent(amax, E4M3_MAX)
    values = to_e4m3(blocks * e8m0.pow2(-exp)[:, None, :, None])
    weight = values.view(rb * block, cb * block)[:rows, :cols].contiguous()
    return weight, e8m0.encode(exp, ~torch.isfinite(amax))


def dequantize_fp8_block2d(
    weight: torch.Tensor, scale: torch.Tensor, block: int = 32, dtype: torch.dtype = torch.bfloat16
) -> torch.Tensor:
    """``W[i, j] = fp8(weight[i, j]) * 2**(scale[i // b, j // b] - 127)``."""
    v = as_e4m3(weight, "fp8 block2d weight")
    rows, cols, rb, cb = _block2d_dims(v.shape, block, "fp8 block2d weight")
    s = e8m0.decode(scale)
    require_shape(s, (rb, cb), "fp8 block2d scale")
    padded = F.pad(v.float(), (0, cb * block - cols, 0, rb * block - rows))
    out = padded.view(rb, block, cb, block) * s[:, None, :, None]
    return out.view(rb * block, cb * block)[:rows, :cols].to(dtype)
