"""Compressor of a KV-source layer: one latent per `ratio` tokens (MODEL.md §4.4).

Ratio 1: `c_t = norm(x_t @ wkv^T)`. Ratio 2: tokens pair up as `(2g, 2g+1)` and each channel
is a softmax-weighted mean of the pair, weights from `wgate`. A pair is emitted when its odd
token arrives, so an even token that ends a forward call is handed back as `pending` and must
be passed in with the next call. The latents returned here are pre-RoPE: the caller derives
index keys from them and ropes + fake-quantises them into the compressed cache.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from sglang_ds41.errors import Ds41Error

from .norm import RMSNorm, upcast


class Compressor(nn.Module):
    def __init__(self, dim: int, head_dim: int, ratio: int, eps: float):
        super().__init__()
        if ratio not in (1, 2):
            raise Ds41Error(f"compressor: compress ratio must be 1 or 2, got {ratio}")
        self.ratio = ratio
        self.wkv = nn.Linear(dim, head_dim, bias=False)
        self.wgate = nn.Linear(dim, head_dim, bias=False) if ratio == 2 else None
        self.norm = RMSNorm(head_dim, eps)

    def forward(
        self, x: torch.Tensor, positions: torch.Tensor, pending: torch.Tensor | None
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """x [T, D] at contiguous positions [T]; pending: the `(a, z)` rows [2, head_dim] of an
        unpaired even token just before positions[0], or None.

        Returns (latents [G, head_dim] pre-RoPE, entry positions [G], new pending)."""
        if self.ratio == 1:
            return self.norm(self.wkv(x)), positions, None
        a = F.linear(upcast(x), upcast(self.wkv.weight))  # [T, head_dim]
        z = F.linear(upcast(x), upcast(self.wgate.weight))  # [T, head_dim]
        az = torch.stack([a, z], dim=1)  # [T, 2, head_dim]
        first = int(positions[0]) if positions.numel() else 0
        if pending is not None:
            if first % 2 == 0:
                raise Ds41Error(
                    f"compressor: got a pending token but the chunk starts at even position {first}"
                )
            az = torch.cat([pending.to(az.dtype)[None], az])
            positions = torch.cat([positions[:1] - 1, positions])
        elif first % 2 == 1:
            raise Ds41Error(
                f"compressor: the chunk starts at odd position {first} but no pending token was passed"
            )
        n_pairs = az.shape[0] // 2
        pairs = az[: 2 * n_pairs].unflatten(0, (n_pairs, 2))  # [G, 2 tokens, (a, z), head_dim]
        weights = torch.softmax(pairs[:, :, 1], dim=1)  # softmax over the two tokens, per channel
        latents = (weights * pairs[:, :, 0]).sum(dim=1).to(x.dtype)  # [G, head_dim]
        new_pending = az[-1] if az.shape[0] % 2 else None
        return self.norm(latents), positions[0 : 2 * n_pairs : 2], new_pending
