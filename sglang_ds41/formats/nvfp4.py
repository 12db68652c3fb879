"""NVFP4 as ModelOpt writes it: E2M1 codes + one E4M3 scale per 16 values + an FP32 global scale.

Checkpoint tensors per projection (ModelOpt names): ``weight`` U8 [out, in/2] (low nibble = even
column), ``weight_scale`` F8_E4M3 [out, in/16] (linear layout, not swizzled), ``weight_scale_2``
F32 0-d, ``input_scale`` F32 0-d (static activation global scale).

Quantisation follows ModelOpt: ``weight_scale_2 = amax(|w|) / (6 * 448)``;
``weight_scale = e4m3(block_amax / (6 * weight_scale_2))`` (1.0 for all-zero blocks);
codes = ``e2m1_rne(w / (weight_scale * weight_scale_2))``. Where a block scale rounds to zero in
E4M3 (a block tiny next to the tensor's amax) the codes are written as zero rather than ModelOpt's
division by zero; both dequantise to zero.
"""

from __future__ import annotations

import torch

from . import e2m1
from .checks import FormatError, require_float, require_multiple, require_shape
from .fp8 import E4M3_MAX, as_e4m3, to_e4m3

BLOCK = 16
TENSOR_NAMES = ("weight", "weight_scale", "weight_scale_2", "input_scale")


def global_scale(amax: torch.Tensor | float) -> torch.Tensor:
    """ModelOpt's per-tensor scale for an amax: ``amax / (6 * 448)`` (also how ``input_scale`` is formed)."""
    return torch.as_tensor(amax, dtype=torch.float32) / (e2m1.MAX * E4M3_MAX)


def quantize_nvfp4(
    w: torch.Tensor, weight_scale_2: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """w [..., K] -> (weight uint8 [..., K/2], weight_scale e4m3 [..., K/16], weight_scale_2 f32 0-d).

    Pass ``weight_scale_2`` to share one global scale between tensors (e.g. fused w1/w3).
    """
    require_float(w, "nvfp4")
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
    denom = (scale.float() * ws2).unsqueeze(-1)
    scaled = torch.where(denom > 0, blocks / denom, torch.zeros_like(blocks))
    codes = e2m1.encode(scaled).reshape(w.shape)
    return e2m1.pack(codes), scale, ws2


def dequantize_nvfp4(
    weight: torch.Tensor,
    weight_scale: torch.Tensor,
    weight_scale_2: torch.Tensor | float,
    dtype: torch.dtype = torch.bfloat16,
) -> torch.Tensor:
    """``W[i, j] = e2m1(code) * (float(weight_scale[i, j // 16]) * weight_scale_2)``.

    The two scales are multiplied first, as ModelOpt's reference dequantiser does.
    """
    values = e2m1.decode(e2m1.unpack(weight))
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
    from . import e8m0

    exponents = e8m0.as_bytes(scales, "mxfp4 scales").to(torch.int32) - e8m0.BIAS
    if exponents.numel() == 0:
        raise FormatError("mxfp4_to_nvfp4: empty scale tensor")
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
