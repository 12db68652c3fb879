"""Engram hash rows (`engram.hashing.EngramHasher`, MODEL.md §5.5) of a ragged batch of chunks,
each continuing the raw ids before it, as one compiled loop.

    rows(hasher, before, before_counts, ids, lengths)
        = hasher.extend(hasher.history_of(before, before_counts), ids, lengths)[0]

The plain path compresses the look-back ids, rebuilds each request's history, builds the
windows and hashes them in ~300 small ops (~0.4 ms a decode step, as much as a layer's MoE);
here the ids are compressed by the hasher (its rule for dead ids) and each token's window is
read, blocked and hashed in place. Integer arithmetic only, so the rows are the oracle's exactly.
"""

from __future__ import annotations

import numpy as np
import torch

from sglang_ds41.engram.hashing import BLOCKED, EngramHasher

from .jit import compiled, host_empty, numpy_of


@compiled
def _rows(before, before_counts, ids, lengths, pad, dead, multipliers, primes, offsets, n_heads, out):
    """out [T, L, C] = the row ids of every chunk token; `before` holds each request's (up to
    N-1) compressed ids before its chunk, oldest first; `dead` (`BLOCKED`, < 0) marks a dead id."""
    n = multipliers.shape[1]
    layers = multipliers.shape[0]
    window = np.empty(n, np.int64)
    b0, t0 = 0, 0
    for r in range(lengths.shape[0]):
        have = before_counts[r]
        for k in range(lengths[r]):
            t = t0 + k
            blocked = False
            for s in range(n):
                j = k - s  # in-chunk index of look-back s; < 0 reaches into `before`
                c = dead
                if j >= 0:
                    c = ids[t - s]
                elif -j <= have:
                    c = before[b0 + have + j]
                blocked = blocked or c < 0  # once a look-back is blocked, every older one is
                window[s] = pad if blocked else c
            for layer in range(layers):
                rho = window[0] * multipliers[layer, 0]
                for s in range(1, n):
                    rho ^= window[s] * multipliers[layer, s]
                    for h in range(n_heads):
                        c = (s - 1) * n_heads + h
                        out[t, layer, c] = rho % primes[layer, c] + offsets[layer, c]
        b0 += have
        t0 += lengths[r]


def rows(
    hasher: EngramHasher,
    before: torch.Tensor,
    before_counts: torch.Tensor,
    ids: torch.Tensor,
    lengths: torch.Tensor,
) -> torch.Tensor:
    """Row ids [T, n_engram_layers, n_columns] of chunks `ids` (concatenated, `lengths [R]`),
    request r's chunk following the `before_counts[r]` <= N-1 raw ids of `before` (concatenated)."""
    out, out_ = host_empty(ids.numel(), *hasher.primes.shape, dtype=torch.int64)
    _rows(
        numpy_of(hasher.compress(before).reshape(-1)),  # the hasher's own rule for dead ids
        numpy_of(before_counts.to(torch.int64)),
        numpy_of(hasher.compress(ids).reshape(-1)),
        numpy_of(lengths.to(torch.int64)),
        hasher.pad,
        BLOCKED,
        numpy_of(hasher.multipliers),
        numpy_of(hasher.primes),
        numpy_of(hasher.offsets),
        hasher.layout.n_heads,
        out_,
    )
    return out
