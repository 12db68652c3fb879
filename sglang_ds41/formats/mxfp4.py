"""MXFP4 (OCP Microscaling): E2M1 codes, two per byte, one E8M0 scale per 32 consecutive values.

Two ways to choose a block's scale; both write standard MXFP4, read by any MXFP4 decoder unchanged:

* ``ocp`` (OCP MX v1.0): shared exponent ``floor(log2 amax) - 2`` (2 = emax of E2M1), clamped to
  the E8M0 range. It keeps the block's largest element in E2M1's top binade, so values in
  [6, 8) * 2**e saturate to 6 * 2**e (a deliberate clip, not a bug).
* ``mse``: the exponent among the OCP one and its two neighbours (``+1``, then ``-1``) whose
  re-rounded block has the smallest squared error; ties keep the OCP exponent, so a block is
  never worse than OCP's. With the exponent fixed, rounding each element to the nearest E2M1
  value is already optimal, so this is the least-squares MXFP4 block whenever the best exponent
  is one of the three; on Gaussian, Laplace and Student-t(3) blocks (FP8-sourced or not) +1 won
  8-14% of blocks and -1, +2, -2 never did (measured on 20,000 rows each).

Elements are rounded to E2M1 with ties to even and saturated to +-6. All-zero blocks get scale
byte 0 (2**-127: the clamp of floor(log2 0) = -inf); blocks holding NaN or inf get the NaN scale
byte 255, so they dequantise to NaN. Both are left to the OCP rule by ``mse``.

The ``mse`` errors are summed in float64, which is exact for blocks whose values carry few
significant bits over a narrow range -- FP8 sources, the case that matters: there the fast
re-encoder of `checkpoint/convert/recode.py` reproduces these choices bit for bit.
"""

from __future__ import annotations

import torch

from . import e2m1, e8m0
from .checks import FormatError, require_float, require_multiple, require_shape
from .fp8 import dequantize_fp8_rows
from .sizes import SCALE_BLOCK

BLOCK = SCALE_BLOCK["mxfp4"]  # 32 values per E8M0 scale
E2M1_EMAX = 2
SCALE_RULES = ("ocp", "mse")
# Exponent offsets from the OCP one that the mse rule tries, in order of preference on a tie.
MSE_OFFSETS = (0, 1, -1)


def _check_rule(scale_rule: str) -> None:
    if scale_rule not in SCALE_RULES:
        raise FormatError(f"mxfp4: unknown scale rule {scale_rule!r}; expected one of {list(SCALE_RULES)}")


def _round_block(blocks: torch.Tensor, exp: torch.Tensor) -> torch.Tensor:
    """E2M1 codes of `blocks` [..., n, 32] under exponents `exp` [..., n]."""
    return e2m1.encode(blocks * e8m0.pow2(-exp).unsqueeze(-1))


def block_squared_error(blocks: torch.Tensor, exp: torch.Tensor) -> torch.Tensor:
    """float64 [..., n]: sum over each block of (MXFP4 value - x)**2 with exponents `exp`."""
    values = e2m1.decode(_round_block(blocks, exp)).double() * e8m0.pow2(exp).double().unsqueeze(-1)
    return (values - blocks.double()).square().sum(dim=-1)


def _least_squares_exponents(blocks: torch.Tensor, ocp: torch.Tensor, usable: torch.Tensor) -> torch.Tensor:
    best, best_err = ocp, None
    for offset in MSE_OFFSETS:
        exp = (ocp + offset).clamp(e8m0.MIN_EXPONENT, e8m0.MAX_EXPONENT)
        err = block_squared_error(blocks, exp)
        if best_err is None:
            best_err = err
            continue
        better = usable & (err < best_err)
        best = torch.where(better, exp, best)
        best_err = torch.where(better, err, best_err)
    return best


def quantize_mxfp4(x: torch.Tensor, scale_rule: str = "ocp") -> tuple[torch.Tensor, torch.Tensor]:
    """x [..., K] -> (codes uint8 [..., K/2], scales float8_e8m0fnu [..., K/32]).

    `scale_rule`: ``ocp`` (the spec's, the default here: routed experts are written with it) or
    ``mse`` (least squared error per block, see the module docstring)."""
    require_float(x, "mxfp4")
    _check_rule(scale_rule)
    k = x.shape[-1]
    require_multiple(k, BLOCK, "mxfp4")
    blocks = x.float().reshape(*x.shape[:-1], k // BLOCK, BLOCK)
    amax = blocks.abs().amax(dim=-1)
    usable = torch.isfinite(amax) & (amax > 0)
    exp = e8m0.floor_log2(torch.where(usable, amax, torch.ones_like(amax))) - E2M1_EMAX
    exp = torch.where(usable, exp, torch.full_like(exp, e8m0.MIN_EXPONENT))
    exp = exp.clamp(e8m0.MIN_EXPONENT, e8m0.MAX_EXPONENT)
    if scale_rule == "mse":
        exp = _least_squares_exponents(blocks, exp, usable)
    codes = _round_block(blocks, exp)
    return e2m1.pack(codes.reshape(x.shape)), e8m0.encode(exp, ~torch.isfinite(amax))


def dequantize_mxfp4(
    codes: torch.Tensor, scales: torch.Tensor, dtype: torch.dtype = torch.bfloat16
) -> torch.Tensor:
    """``W[..., j] = e2m1(code[..., j]) * 2**(scale[..., j // 32] - 127)``; codes may be uint8 or int8."""
    values = e2m1.decode_packed(codes)
    k = values.shape[-1]
    require_multiple(k, BLOCK, "mxfp4 codes", dim="unpacked last dim")
    s = e8m0.decode(scales)
    require_shape(s, (*values.shape[:-1], k // BLOCK), "mxfp4 scales")
    out = values.reshape(*values.shape[:-1], k // BLOCK, BLOCK) * s.unsqueeze(-1)
    return out.reshape(values.shape).to(dtype)


def fp8_rows_to_mxfp4(
    values: torch.Tensor, scales: torch.Tensor, block: int = 32, *, scale_rule: str = "ocp"
) -> tuple[torch.Tensor, torch.Tensor]:
    """Re-encode FP8 row blocks (e.g. the official Engram table) as MXFP4.

    The FP8 rows are dequantised exactly in float32 first, so the only rounding is MXFP4's own."""
    exact = dequantize_fp8_rows(values, scales, block=block, dtype=torch.float32)
    return quantize_mxfp4(exact, scale_rule)
