"""RMSNorm and the dtype rule every op of the model follows (MODEL.md conventions).

"fp32 math" in the spec means: upcast, compute, cast back to the activation dtype. The
exactness tests run the whole model in float64, so the upcast keeps float64 as it is instead
of rounding it down to float32.
"""

from __future__ import annotations

import torch
from torch import nn


def upcast(x: torch.Tensor) -> torch.Tensor:
    """The dtype of "fp32 math": float32, or float64 when the model runs in float64."""
    return x if x.dtype == torch.float64 else x.float()


def rms_scale(x: torch.Tensor, eps: float) -> torch.Tensor:
    """1 / RMS over the last dim (unweighted), in the upcast dtype; [..., D] -> [..., 1]."""
    x = upcast(x)
    return torch.rsqrt(x.square().mean(dim=-1, keepdim=True) + eps)


class RMSNorm(nn.Module):
    """Weighted RMSNorm; every norm of the LM uses `rms_norm_eps` (1e-20 in V4.1)."""

    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = upcast(x) * rms_scale(x, self.eps)  # [..., D]
        return (y * upcast(self.weight)).to(x.dtype)
