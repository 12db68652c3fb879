"""NVFP4 as ModelOpt writes it: E2M1 codes + one E4M3 scale per 16 values + an FP32 global scale.

Checkpoint tensors per projection (ModelOpt names): ``weight`` U8 [out, in/2] (low nibble = even
column), ``weight_scale`` F8_E4M3 [out, in/16] (linear layout, not swizzled), ``weight_scale_2``
F32 0-d, ``input_scale`` F32 0-d (static activation global scale).

Quantisation follows ModelOpt: ``weight_scale_2 = amax(|w|) / (6 * 448)``;
``weight_scale = e4m3(block_amax / (6 * weight_scale_2))`` (1.0 for all-zero blocks);
codes = ``e2m1_rne(w / (weight_scale * weight_scale_2))``. Where a block scale rounds to zero in
E4M3 (a block tiny next to the tensor's amax) the codes are written as zero rather than ModelOpt's
division by zero; both dequantise to zero. Scale rules: ``modelopt`` (that one) or ``mse``: of
the ModelOpt scale byte and its two E4M3 neighbours (next larger, then next smaller), the one
whose re-rounded block has the least squared error, ties keeping ModelOpt's. E4M3 scales are 3
mantissa bits, so ModelOpt's rounding of ``amax / 6`` leaves the top element up to 6% off the
grid's end; trying the neighbours recovers much of that (row cosine 0.9956 -> 0.9963 on
Gaussian rows). Any NVFP4 decoder reads both unchanged.

**NVFP4 Engram tables** (our decision; MODEL.md §8.4 lists community releases, no official one):
the same three tensors per table, ModelOpt-named like the experts'
``layers.L.engram.embed.weight`` U8 (or I8) ``[rows, head_dim / 2]``,
``layers.L.engram.embed.weight_scale`` F8_E4M3 ``[rows, head_dim / 16]`` and
``layers.L.engram.embed.weight_scale_2`` F32 0-d (one per table), and no ``input_scale`` (a
table is looked up, never a GEMM input); ``quantization_config.engram_embed_quant = "nvfp4"``,
``engram_embed_block_size = 16``; 144 B per 256-value row. `fp8_rows_to_nvfp4` encodes the
official FP8 rows: its global scale is ModelOpt's formula applied to the FP8 table's own bound
on its amax, ``448 * 2**(max scale byte - 127)``, which the scale tensor alone gives (3% of the
table's bytes) instead of a second pass over 100 GB of rows. The true amax is within a factor 2
of it (the FP8 rule puts every block's amax in (224, 448] * its scale), so at most one of E4M3's
18 binades of block-scale range goes unused, at the small end.
"""

from __future__ import annotations

import torch

from . import e2m1, e8m0
from .checks import FormatError, require_float, require_multiple, require_shape
from .fp8 import E4M3_MAX, as_e4m3, dequantize_fp8_rows, to_e4m3
from .sizes import SCALE_BLOCK

BLOCK = SCALE_BLOCK["nvfp4"]  # 16 values per E4M3 scale
TENSOR_NAMES = ("weight", "weight_scale", "weight_scale_2", "input_scale")
SCALE_RULES = ("modelopt", "mse")
# E4M3 scale-byte steps from ModelOpt's that the mse rule tries, in order of preference on a tie.
MSE_OFFSETS = (0, 1, -1)
_E4M3_MAX_BYTE = 0x7E  # 448; 0x7F is NaN


def global_scale(amax: torch.Tensor | float) -> torch.Tensor:
    """ModelOpt's per-tensor scale for an amax: ``amax / (6 * 448)`` (also how ``input_scale`` is formed)."""
    return torch.as_tensor(amax, dtype=torch.float32) / (e2m1.MAX * E4M3_MAX)


def _block_codes(
    blocks: torch.Tensor, scale: torch.Tensor, ws2: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """(E2M1 codes of `blocks` [..., n, 16] under E4M3 scales [..., n], their float32 divisors)."""
    denom = (scale.float() * ws2).unsqueeze(-1)
    scaled = torch.where(denom > 0, blocks / denom, torch.zeros_like(blocks))
    return e2m1.encode(scaled), denom


def block_squared_error(blocks: torch.Tensor, scale: torch.Tensor, ws2: torch.Tensor) -> torch.Tensor:
    """float64 [..., n]: each block's sum of (NVFP4 value - x)**2 under E4M3 scales `scale`.

    Summed column by column in a fixed order, so a compiled encoder doing the same float64
    operations makes the same choices bit for bit."""
    codes, denom = _block_codes(blocks, scale, ws2)
    diff = (e2m1.decode(codes).double() * denom.double() - blocks.double()).square()
    err = diff[..., 0]
    for j in range(1, diff.shape[-1]):
        err = err + diff[..., j]
    return err


def _least_squares_scales(blocks: torch.Tensor, scale: torch.Tensor, ws2: torch.Tensor) -> torch.Tensor:
    first = scale.view(torch.uint8).to(torch.int32)
    best, best_err = scale, block_squared_error(blocks, scale, ws2)
    for offset in MSE_OFFSETS[1:]:
        candidate = (first + offset).clamp(0, _E4M3_MAX_BYTE).to(torch.uint8).view(torch.float8_e4m3fn)
        err = block_squared_error(blocks, candidate, ws2)
        better = err < best_err  # NaN blocks never compare better
        chosen = torch.where(better, candidate.view(torch.uint8), best.view(torch.uint8))
        best = chosen.view(torch.float8_e4m3fn)
        best_err = torch.where(better, err, best_err)
    return best


def quantize_nvfp4(
    w: torch.Tensor, weight_scale_2: torch.Tensor | float | None = None, scale_rule: str = "modelopt"
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """w [..., K] -> (weight uint8 [..., K/2], weight_scale e4m3 [..., K/16], weight_scale_2 f32 0-d).

    Pass ``weight_scale_2`` to share one global scale between tensors (e.g. fused w1/w3).
    `scale_rule`: ``modelopt`` (default) or ``mse`` (see the module docstring)."""
    require_float(w, "nvfp4")
    if scale_rule not in SCALE_RULES:
        raise FormatError(f"nvfp4: unknown scale rule {scale_rule!r}; expected one of {list(SCALE_RULES)}")
    k = w.shape[-1]
    require_multiple(k, BLOCK, "nvfp4")
    xf = w.float()
    if weight_scale_2 is None:
        weight_scale_2 = global_scale(xf.abs().amax())
    ws2 = torch.as_tensor(weight_scale_2, dtype=torch.float32, device=w.device).reshape(())
    blocks = xf.reshape(*w.shape[:-1], k // BLOCK, BLOCK)
    amax = blocks.abs().amax(dim=-1)
    ratio = amax / (e2m1.MAX * ws2)
    scale = to_e4m3(torch.where(amax == 0, torch.ones_like(ratio), ratio))
    if scale_rule == "mse":
        scale = _least_squares_scales(blocks, scale, ws2)
    codes, _ = _block_codes(blocks, scale, ws2)
    return e2m1.pack(codes.reshape(w.shape)), scale, ws2


def dequantize_nvfp4(
    weight: torch.Tensor,
    weight_scale: torch.Tensor,
    weight_scale_2: torch.Tensor | float,
    dtype: torch.dtype = torch.bfloat16,
) -> torch.Tensor:
    """``W[i, j] = e2m1(code) * (float(weight_scale[i, j // 16]) * weight_scale_2)``.

    The two scales are multiplied first, as ModelOpt's reference dequantiser does."""
    values = e2m1.decode_packed(weight)
    k = values.shape[-1]
    require_multiple(k, BLOCK, "nvfp4 weight", dim="unpacked last dim")
    s = as_e4m3(weight_scale, "nvfp4 weight_scale").float()
    require_shape(s, (*values.shape[:-1], k // BLOCK), "nvfp4 weight_scale")
    ws2 = torch.as_tensor(weight_scale_2, dtype=torch.float32, device=values.device)
    if ws2.numel() != 1:
        raise FormatError(f"nvfp4 weight_scale_2: expected a scalar, got shape {list(ws2.shape)}")
    block_scale = (s * ws2.reshape(())).unsqueeze(-1)
    out = values.reshape(*values.shape[:-1], k // BLOCK, BLOCK) * block_scale
    return out.reshape(values.shape).to(dtype)


def global_scale_of_scale_byte(top: int | None) -> torch.Tensor:
    """``weight_scale_2`` of FP8 rows whose largest (non-NaN) E8M0 scale byte is `top`: ModelOpt's
    formula on the rows' amax bound ``448 * 2**(top - 127)``, i.e. ``2**(top - 127) / 6``,
    computed in float64 and rounded once to float32 (the bound itself overflows float32 for the
    top bytes; the scale never does). None (no finite block) counts as byte 127."""
    top = e8m0.BIAS if top is None else int(top)
    bound = 2.0 ** (top - e8m0.BIAS) * E4M3_MAX
    return torch.tensor(bound / (e2m1.MAX * E4M3_MAX), dtype=torch.float64).float()


def fp8_rows_global_scale(scales: torch.Tensor) -> torch.Tensor:
    """``weight_scale_2`` for FP8 rows from their E8M0 scales alone (NaN bytes ignored)."""
    b = e8m0.as_bytes(scales, "fp8 rows scales")
    finite = b[b != e8m0.NAN_BYTE]
    return global_scale_of_scale_byte(int(finite.max()) if finite.numel() else None)


def fp8_rows_to_nvfp4(
    values: torch.Tensor,
    scales: torch.Tensor,
    weight_scale_2: torch.Tensor | float | None = None,
    block: int = 32,
    *,
    scale_rule: str = "modelopt",
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Re-encode FP8 row blocks (the official Engram table) as NVFP4 Engram rows.

    The FP8 rows are dequantised exactly in float32 first. `weight_scale_2` defaults to
    `fp8_rows_global_scale(scales)`; a table converted in pieces passes the whole table's."""
    exact = dequantize_fp8_rows(values, scales, block=block, dtype=torch.float32)
    if weight_scale_2 is None:
        weight_scale_2 = fp8_rows_global_scale(scales)
    return quantize_nvfp4(exact, weight_scale_2, scale_rule)


def mxfp4_to_nvfp4(
    codes: torch.Tensor, scales: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Re-express MXFP4 weights as NVFP4 without changing a single dequantised value.

    The E2M1 codes are kept as they are; each 32-block's power of two ``2**e`` becomes the
    E4M3 scale ``2**(e - g)`` of both of its 16-blocks, with a power-of-two global scale
    ``2**g`` chosen so every block scale is an exact E4M3 value (2**-9 .. 2**8). This is how a
    lossless conversion of the MXFP4 release to NVFP4 can be written; it fails loudly when the
    tensor's scales span more binades than E4M3 can hold.
    """
    exponents = e8m0.as_bytes(scales, "mxfp4 scales").to(torch.int32) - e8m0.BIAS
    if exponents.numel() == 0:
        raise FormatError(f"mxfp4_to_nvfp4: expected at least one scale, got shape {list(scales.shape)}")
    top = int(exponents.max())
    g = top - 8  # largest block scale maps to 2**8 = 256, the top power of two below 448
    if int(exponents.min()) - g < -9:
        raise FormatError(
            f"mxfp4_to_nvfp4: block exponents span [{int(exponents.min())}, {top}], more than the 18 "
            "binades E4M3 scales cover exactly; this tensor cannot be converted losslessly"
        )
    block_scale = torch.pow(2.0, (exponents - g).float())
    weight_scale = block_scale.repeat_interleave(2, dim=-1).to(torch.float8_e4m3fn)
    global_ = torch.tensor(2.0**g, dtype=torch.float32)
    return codes.view(torch.uint8), weight_scale, global_
