"""The output head over its nonzero rows only.

The trained tiny model (docs/TRAINING.md §3.3) keeps the head rows of the ids its corpus never
uses at exactly zero: ~80% of the 129,280. Their logits are 0 whatever the hidden state, so the
GEMM needs only the other rows, and at that size the head is the largest GEMM of a decode step
(a 66 MB read, ~6 ms of an ~18 ms step at hidden 128). A head with few zero rows (every real
checkpoint) is computed whole, as before.

The logits of the nonzero rows are the same dot products; BLAS may block a shorter GEMM
differently, so they can differ from the whole GEMM's in the last bit, as the backend's other
fast paths may. A non-finite hidden state would make the whole GEMM's zero rows NaN; here they
stay 0 (the final RMSNorm keeps hidden states finite).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from sglang_ds41.model.norm import upcast

from .jit import prepared

# Below this share of zero rows the whole GEMM is as cheap as the gather of the rest.
MIN_ZERO_SHARE = 0.25


def logits(head: nn.Linear, h: torch.Tensor) -> torch.Tensor:
    """`F.linear(upcast(h), upcast(head.weight))`: h [T, D] -> [T, rows of head] in h's upcast
    dtype, skipping the rows that are all zero."""
    h = upcast(h)
    weight = lambda: head.weight.detach().to(h.dtype)  # noqa: E731
    used = prepared(head, f"_nonzero_{h.dtype}", lambda: _nonzero_rows(weight()), head.weight)
    if used is None:
        return F.linear(h, weight())
    rows, compact = used
    out = h.new_zeros(h.shape[0], head.weight.shape[0])
    return out.index_copy_(1, rows, F.linear(h, compact))


def _nonzero_rows(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor] | None:
    """(ids of the nonzero rows, those rows contiguous), or None when too few rows are zero."""
    nonzero = weight.ne(0).any(dim=1)
    if 1 - float(nonzero.float().mean()) < MIN_ZERO_SHARE:
        return None
    rows = nonzero.nonzero().flatten()
    return rows, weight[rows].contiguous()


class SglangHead:
    """The head as SGLang's `LogitsProcessor` takes a quantised one: its `weight`, and a
    `quant_method` whose `apply(layer, hidden, bias)` gives the logits (the ones above). A plain
    object, not a module: SGLang's loader post-processes every module that has a quant_method."""

    def __init__(self, head: nn.Linear):
        self.head, self.quant_method = head, self

    @property
    def weight(self) -> torch.Tensor:
        return self.head.weight

    def apply(self, layer: SglangHead, x: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        out = logits(self.head, x)
        return out if bias is None else out + bias
