"""Batch plumbing around `model.attention.Attention`: one SGLang forward batch, many requests.

The math of a layer is `Attention.forward(x, positions, state, published)` for one request's
chunk. Here each request of the batch gets its state from the slot store (`kv_state`), runs
that same forward, and stores what it added. This is the torch-native CPU path and the seam
for GPU kernels: a kernel backend replaces `batch_attention` (gather + sparse attention
over all requests at once) and keeps the same slot layout.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from sglang_ds41.model.attention import Attention, AttentionState, Published

from .kv_state import SlotState, Span


class SlotAttention(Attention):
    """`Attention` that keeps what the slot store needs of a forward: the window KV of every
    new token (the returned state holds only the last window) and the unquantised input of the
    new compressed entries (the store keeps their FP4 codes)."""

    new_window_kv: torch.Tensor | None = None
    new_entries: torch.Tensor | None = None

    def window_kv(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        self.new_window_kv = super().window_kv(x, positions)
        return self.new_window_kv

    def quantize_entries(self, rotated: torch.Tensor) -> torch.Tensor:
        self.new_entries = rotated
        return super().quantize_entries(rotated)


def batch_attention(
    attn: SlotAttention,
    x: torch.Tensor,
    positions: torch.Tensor,
    spans: Sequence[Span],
    published: Sequence[Published],
    store: SlotState,
) -> torch.Tensor:
    """One layer for every request of a batch: x [T, D] (the requests' new tokens, in span
    order) -> y [T, D]. `published[i]`: request i's scratch, shared by the layers of a forward."""
    y = torch.empty_like(x)
    for span, scratch in zip(spans, published, strict=True):
        rows = slice(span.offset, span.offset + span.length)
        state: AttentionState = store.before(attn.layer, span)
        y[rows], after = attn(x[rows], positions[rows], state, scratch)
        store.commit(attn.layer, span, attn.new_window_kv, after, attn.new_entries)
        attn.new_window_kv = attn.new_entries = None
    return y
