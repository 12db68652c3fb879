"""The output head over its nonzero rows only.

The trained tiny model (docs/TRAINING.md §3.3) keeps the head rows of the ids its corpus never
uses at exactly zero: ~80% of the 129,280. Their logits are 0 whatever the hidden state, so the
GEMM needs only the other rows, and at that size the head is the largest GEMM of a decode step
(a 66 MB read, ~6 ms of an ~18 ms step at hidden 128). A head with few zero rows (every real
checkpoint) is computed over all its rows.

The logits of the nonzero rows are the same dot products; BLAS may block a shorter GEMM
differently, so they can differ from the whole GEMM's in the last bit, as the backend's other
fast paths may. A non-finite hidden state would make the whole GEMM's zero rows NaN; here they
stay 0 (the final RMSNorm keeps hidden states finite).

A head whose float32 values are all BF16 values (every checkpoint's: the layout stores the
head in BF16, MODEL.md §8.5), at a hidden size of at most KERNEL_HIDDEN, is computed for up to
KERNEL_ROWS rows by a compiled loop over its BF16 bits: half the bytes of the float32 copy,
each row widened to float32 as it is read (exact), every logit one float32 dot product with its
sum vectorised. It writes the nonzero rows' logits into their columns, with no compact result
to scatter. Measured (one thread, median of 7; 129,280 x 128, 1 / 8 / 16 / 32 rows): 1.6 /
5.4 / 11.0 / 19.6 ms against the BLAS paths below's 4.1 / 10.2 / 16.1 / 23.4; at hidden 64
1.3 / 2.9 / 5.9 / 11.5 against 2.2 / 6.5 / 8.2 / 12.3, and past 32 rows there no faster; a
decode step (512 tokens of context, old and new code in turns) 0.94x / 0.90x at batch 1 / 16
for the tiny size, 0.88x / 0.91x at the trained shape, 0.93x / 0.92x for the shipped model.
On this path each logit is summed from its own row alone, so a request's logits do not
depend on the other requests of its batch (up to KERNEL_ROWS rows; the BLAS paths make no
such promise).

Other heads (float64, or values that are not BF16) go through BLAS; a decode step's few rows
against a hidden size of 128 or more through the product the other way round, W h^T: one GEMM
whose long side is the vocabulary. MKL's kernels for h W^T with a handful of rows (its GEMV for
one) read a head that does not fit the caches at ~7 GB/s here; W h^T streams it at ~16 GB/s
(one thread, float32, measured on this project's 2-core CPUs, median of 9 alternating runs:
129,280 x 128 at 1 / 2 / 4 / 8 rows 9.0 / 17.9 / 11.7 / 12.8 ms -> 4.1 / 4.7 / 6.7 / 10.3 ms;
the 39,078 nonzero rows of the trained model at 1 row 3.0 -> 1.4 ms). Past 8 rows, and at
hidden 64, the plain product was as fast or faster, so it stays. The same dot products, summed
in another blocking: within float rounding of h W^T.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from sglang_ds41.model.norm import upcast

from .jit import compiled, compiles, numpy_of, prepared

# Below this share of zero rows the whole GEMM is as cheap as the gather of the rest.
MIN_ZERO_SHARE = 0.25
# Up to this many rows, at a hidden size of at least WIDE_HIDDEN, the head is computed as W h^T.
FEW_ROWS = 8
WIDE_HIDDEN = 128
# Up to this many rows, at a hidden size of at most KERNEL_HIDDEN (the sizes it was measured
# at, and a little more), a float32 head of BF16 values goes through the compiled loop.
KERNEL_ROWS = 32
KERNEL_HIDDEN = 256


def logits(head: nn.Linear, h: torch.Tensor) -> torch.Tensor:
    """`F.linear(upcast(h), upcast(head.weight))`: h [T, D] -> [T, rows of head] in h's upcast
    dtype, skipping the rows that are all zero."""
    h = upcast(h)
    weight = lambda: head.weight.detach().to(h.dtype)  # noqa: E731
    if h.dtype == torch.float32 and compiles(h) and h.shape[0] <= KERNEL_ROWS and h.shape[1] <= KERNEL_HIDDEN:
        packed = prepared(head, "_bf16_rows", lambda: _bf16_rows(weight()), head.weight)
        if packed is not None:
            rows, bits = packed
            zeros = bits.shape[0] < head.weight.shape[0]
            out = (h.new_zeros if zeros else h.new_empty)(h.shape[0], head.weight.shape[0])
            _bf16_logits(numpy_of(h.contiguous()), bits, rows, numpy_of(out))
            return out
    used = prepared(head, f"_nonzero_{h.dtype}", lambda: _nonzero_rows(weight()), head.weight)
    if used is None:
        return product(h, weight())
    rows, compact = used
    out = h.new_zeros(h.shape[0], head.weight.shape[0])
    return out.index_copy_(1, rows, product(h, compact))


def product(h: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """`F.linear(h, weight)`: [T, D] x [N, D] -> [T, N]; for a few rows of a wide hidden size
    as W h^T, within rounding of it (module doc)."""
    tokens = h.shape[0]
    if tokens > FEW_ROWS or h.shape[1] < WIDE_HIDDEN:
        return F.linear(h, weight)
    if tokens == 1:  # one column would be MKL's GEMV again
        h = torch.cat([h, h.new_zeros(1, h.shape[1])])
    return (weight @ h.T)[:, :tokens].T.contiguous()


def _nonzero_rows(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor] | None:
    """(ids of the nonzero rows, those rows contiguous), or None when too few rows are zero."""
    rows = _nonzero_ids(weight)
    if 1 - rows.numel() / weight.shape[0] < MIN_ZERO_SHARE:
        return None
    return rows, weight[rows].contiguous()


def _nonzero_ids(weight: torch.Tensor) -> torch.Tensor:
    """The ids of the rows of `weight` that hold a nonzero value, ascending."""
    return weight.ne(0).any(dim=1).nonzero().flatten()


def _bf16_rows(weight: torch.Tensor) -> tuple[np.ndarray, np.ndarray] | None:
    """(ids of the nonzero rows, their BF16 bits [N, D] uint16) of a float32 weight whose
    values are all BF16 values (low 16 bits zero), or None when one is not."""
    if weight.dtype != torch.float32:
        return None
    bits = weight.contiguous().view(torch.int32)
    if bool(bits.bitwise_and(0xFFFF).any()):
        return None
    rows = _nonzero_ids(weight)
    high = bits[rows].bitwise_right_shift(16).to(torch.int16)  # the BF16 bits, as a view wants
    return rows.numpy(), high.numpy().view(np.uint16)


@compiled(reassociate=True)
def _bf16_logits(h, bits, rows, out):
    """out[t, rows[n]] = h[t] . float32(bits[n]), four weight rows widened at a time."""
    tokens, width = h.shape
    count = bits.shape[0]
    widened = np.empty((4, width), np.uint32)
    w = widened.view(np.float32)
    whole = count - count % 4
    for n in range(0, whole, 4):
        for j in range(4):
            for k in range(width):
                widened[j, k] = np.uint32(bits[n + j, k]) << 16
        for t in range(tokens):
            s0 = s1 = s2 = s3 = np.float32(0.0)
            for k in range(width):
                x = h[t, k]
                s0 += x * w[0, k]
                s1 += x * w[1, k]
                s2 += x * w[2, k]
                s3 += x * w[3, k]
            out[t, rows[n]] = s0
            out[t, rows[n + 1]] = s1
            out[t, rows[n + 2]] = s2
            out[t, rows[n + 3]] = s3
    for n in range(whole, count):
        for k in range(width):
            widened[0, k] = np.uint32(bits[n, k]) << 16
        for t in range(tokens):
            s = np.float32(0.0)
            for k in range(width):
                s += h[t, k] * w[0, k]
            out[t, rows[n]] = s


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
