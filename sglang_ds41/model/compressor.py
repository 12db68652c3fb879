"""Compressor of a KV-source layer: one latent per `ratio` tokens (MODEL.md §4.4).

Ratio 1: `c_t = norm(x_t @ wkv^T)`. Ratio 2: tokens pair up as `(2g, 2g+1)` and each channel
is a softmax-weighted mean of the pair, weights from `wgate`. A pair is emitted when its odd
token arrives, so an even token that ends a forward call is handed back as `pending` and must
be passed in with the next call (`compress` runs a whole batch of requests, each with its own
pending token; `forward` is one request). The latents returned here are pre-RoPE: the caller
derives index keys from them and ropes + fake-quantises them into the compressed cache.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from sglang_ds41.errors import Ds41Error

from .batch import Chunks
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
        """One request: x [T, D] at contiguous positions [T]; pending: the `(a, z)` rows
        [2, head_dim] of an unpaired even token just before positions[0], or None.

        Returns (latents [G, head_dim] pre-RoPE, entry positions [G], new pending)."""
        first = int(positions[0]) if positions.numel() else 0
        if self.ratio == 2 and pending is not None and first % 2 == 0:
            raise Ds41Error(f"compressor: got a pending token but the chunk starts at even position {first}")
        chunks = Chunks.of([first], [x.shape[0]])
        latents, entry_positions, new = self.compress(x, chunks, None if pending is None else pending[None])
        return latents, entry_positions, None if new is None else new[0]

    def compress(
        self, x: torch.Tensor, chunks: Chunks, pending: torch.Tensor | None
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """Every request of a batch: x [T, D] (`chunks`' rows); pending [B, 2, head_dim]: each
        request's unpaired even token before its chunk (read for requests starting at an odd
        position only), or None when no request does.

        Returns (latents [G, head_dim] pre-RoPE, entry positions [G], new pending [B, 2,
        head_dim] or None): entries request after request, in position order; a request's new
        pending row is its last token's when that token is even (its chunk ends at an odd
        length), other rows are zero."""
        positions = chunks.positions.to(x.device)
        if self.ratio == 1:
            return self.norm(self.wkv(x)), positions, None
        a = F.linear(upcast(x), upcast(self.wkv.weight))  # [T, head_dim]
        z = F.linear(upcast(x), upcast(self.wgate.weight))  # [T, head_dim]
        az = torch.stack([a, z], dim=1)  # [T, (a, z), head_dim]
        waiting = chunks.starts % 2 == 1
        if pending is None and bool(waiting.any()):
            first = int(chunks.starts[waiting][0])
            raise Ds41Error(
                f"compressor: the chunk starts at odd position {first} but no pending token was passed"
            )
        t = az.shape[0]
        rows = torch.arange(t, device=x.device)
        request = chunks.request.to(x.device)
        # A pair is emitted when its odd token arrives; its even partner is the row before, or
        # the request's pending token (stacked after the batch's rows) when the chunk starts odd.
        odd = positions % 2 == 1
        starts_chunk = rows == chunks.offsets.to(x.device)[request]
        partner = torch.where(starts_chunk, t + request, rows - 1)[odd]
        both = az if pending is None else torch.cat([az, pending.to(az.dtype)])
        pairs = torch.stack([both[partner], az[odd]], dim=1)  # [G, 2 tokens, (a, z), head_dim]
        weights = torch.softmax(pairs[:, :, 1], dim=1)  # softmax over the two tokens, per channel
        latents = (weights * pairs[:, :, 0]).sum(dim=1).to(x.dtype)  # [G, head_dim]
        unpaired = chunks.ends % 2 == 1
        new_pending = None
        if bool(unpaired.any()):
            new_pending = az.new_zeros(chunks.size, *az.shape[1:])
            new_pending[unpaired] = az[chunks.offsets[1:][unpaired] - 1]
        return self.norm(latents), positions[odd] - 1, new_pending
