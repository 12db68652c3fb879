"""One attention layer for a whole SGLang forward batch: the phases of `model.attention.Attention`
over the slot store, each run once for all requests (varlen rows, `model.batch.Chunks`).

    project -> commit into the pool -> select -> attend

which is `Attention.forward` (the reference) with SGLang's pool bytes in place of the
reference's tensors and each phase's fast path (`fast.attention`, the phase to rounding): the
store writes what project made (`SlotState.commit`) and the later phases read the pool
through `SlotState.view` (window rows, index keys of the entries scored, latents of the
entries picked). This is the torch-native CPU path and the seam for kernels: a kernel backend
replaces a phase (the indexer scan of `select`, the gather + sparse attention of `attend`)
and keeps the slot layout.
"""

from __future__ import annotations

import torch

from sglang_ds41.fast import attention as fast
from sglang_ds41.model.attention import Attention, Published
from sglang_ds41.model.batch import Chunks

from .kv_state import SlotState


def batch_attention(
    attn: Attention, x: torch.Tensor, chunks: Chunks, published: Published, store: SlotState
) -> torch.Tensor:
    """One layer for every request of a batch: x [T, D] (the requests' new tokens, `chunks`'
    rows) -> y [T, D]. `published`: the forward's scratch, shared by its layers."""
    projected = fast.project(attn, x, chunks, store.pending_rows(attn.layer))
    store.commit(attn.layer, projected)
    view = store.view(attn.layer)
    ids = fast.select(attn, x, projected, chunks, view, published)
    return fast.attend(attn, projected, chunks, view, ids)
