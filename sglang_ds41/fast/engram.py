"""The Engram layer's gate (`engram.gate.apply_engram`, MODEL.md §5.6 steps 2-7) as one compiled
loop: per token and copy, the normalised dot of the copy with its key, the signed square root,
the sigmoid, and the shared value added. The oracle's ~20 ops cost more than their arithmetic
at a decode step's few rows. Sums run in float64, so float32 results may differ from the
oracle's in the last bits, and more where a copy's dot is near 0: the signed square root with
its floor turns a rounding of the dot's sign there into a gate step of ~5e-4 (the math's, in
either form). Image rows are returned unchanged, bit for bit. Tensors that need gradients take
the oracle (the loop has no autograd).
"""

from __future__ import annotations

import numpy as np
import torch

from sglang_ds41.engram import gate
from sglang_ds41.engram.gate import GATE_FLOOR

from .jit import compiled, compiles, host_empty, numpy_of


def apply_engram(
    residual: torch.Tensor,
    kv: torch.Tensor,
    weight: torch.Tensor,
    eps: float,
    image_mask: torch.Tensor | None = None,
) -> torch.Tensor:
    """`gate.apply_engram(residual, kv, weight, eps, image_mask)`: R [T, hc, D], kv [T, (hc + 1) * D],
    weight [hc, D] -> R' [T, hc, D]."""
    t, hc, d = residual.shape
    fits = kv.shape == (t, (hc + 1) * d) and weight.shape == (hc, d)  # else the oracle's error
    same = residual.dtype == kv.dtype == weight.dtype
    grad = torch.is_grad_enabled() and any(x.requires_grad for x in (residual, kv, weight))
    if not (fits and same and compiles(residual)) or grad:  # no autograd through the loop
        return gate.apply_engram(residual, kv, weight, eps, image_mask)
    image = torch.zeros(t, dtype=torch.bool) if image_mask is None else image_mask.reshape(t)
    out, out_ = host_empty(*residual.shape, dtype=residual.dtype)
    _gate(
        numpy_of(residual.contiguous()), numpy_of(kv.contiguous()), numpy_of(weight.contiguous()), eps,
        GATE_FLOOR, numpy_of(image.contiguous()), out_,
    )  # fmt: skip
    return out


@compiled(reassociate=True, ieee_division=True)
def _gate(r, kv, weight, eps, floor, image, out):
    t_rows, hc, d = r.shape
    for t in range(t_rows):
        if image[t]:
            out[t] = r[t]
            continue
        for k in range(hc):
            dot = rr = kk = 0.0
            for i in range(d):
                x, key = np.float64(r[t, k, i]), np.float64(kv[t, k * d + i])
                dot += x * weight[k, i] * key
                rr += x * x
                kk += key * key
            g = dot / np.sqrt(rr / d + eps) / np.sqrt(kk / d + eps) / np.sqrt(d)
            g = np.sign(g) * np.sqrt(max(abs(g), floor))
            g = 1.0 / (1.0 + np.exp(-g))
            for i in range(d):
                out[t, k, i] = r[t, k, i] + g * kv[t, hc * d + i]
