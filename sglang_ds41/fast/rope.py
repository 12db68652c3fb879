"""RoPE (`model.rope.RotaryEmbedding`, MODEL.md §4.2) and RMSNorm (`model.norm.RMSNorm`) as
compiled loops, with the cos / sin of every position kept in a table per rotary embedding.

    rotate(rope, x, positions, inverse)       = rope(x, positions, inverse)
    rms_norm(norm, x)                         = norm(x)
    norm_rotate(norm, rope, x, positions)     = rope(norm(x), positions)

The table holds float64 cos / sin of `position * f_i` (the oracle's float64 angles), built
for positions 0..n-1 and doubled when a later position needs it. The rotation runs in the
oracle's dtype ("fp32 math": float32, or float64 in a float64 model), so it is the oracle's
arithmetic; the norm accumulates in float64.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from sglang_ds41.model.norm import RMSNorm, upcast
from sglang_ds41.model.rope import RotaryEmbedding

from .jit import compiled, compiles, host_empty, numpy_of, prepared


def tables(
    rope: RotaryEmbedding, positions: torch.Tensor, dtype: torch.dtype
) -> tuple[np.ndarray, np.ndarray]:
    """(cos, sin) [n, rope_dim / 2] in `dtype` for positions 0..n-1, n > every position given."""
    top = int(positions.max()) + 1 if positions.numel() else 1
    found = rope.__dict__.get("_fast_tables", {}).get(dtype)
    if found is None or found[0].shape[0] < top:
        n = max(top, 2 * (found[0].shape[0] if found is not None else 1024))
        angles = torch.arange(n, dtype=torch.float64)[:, None] * rope.freqs  # [n, rope_dim/2]
        found = (numpy_of(angles.cos().to(dtype)), numpy_of(angles.sin().to(dtype)))
        rope.__dict__.setdefault("_fast_tables", {})[dtype] = found
    return found


@compiled
def _rotate(x, positions, cos, sin, inverse, out):
    """x [T, H, D] -> out: the last 2 * cos.shape[1] channels rotated by position (or back).
    The inverse spells out the oracle's negated sine: a - b * (-s) is a + b * s exactly."""
    t_rows, heads, d = x.shape
    half = cos.shape[1]
    first = d - 2 * half
    for t in range(t_rows):
        p = positions[t]
        for h in range(heads):
            for i in range(first):
                out[t, h, i] = x[t, h, i]
            for i in range(half):
                c, s = cos[p, i], sin[p, i]
                even, odd = x[t, h, first + 2 * i], x[t, h, first + 2 * i + 1]
                if inverse:
                    out[t, h, first + 2 * i] = even * c + odd * s
                    out[t, h, first + 2 * i + 1] = odd * c - even * s
                else:
                    out[t, h, first + 2 * i] = even * c - odd * s
                    out[t, h, first + 2 * i + 1] = even * s + odd * c


def rotate(
    rope: RotaryEmbedding, x: torch.Tensor, positions: torch.Tensor, inverse: bool = False
) -> torch.Tensor:
    """`rope(x, positions, inverse)` for x [T, ..., D] in float32 / float64."""
    if not compiles(x):
        return rope(x, positions, inverse)
    cos, sin = tables(rope, positions, x.dtype)
    x3 = x.reshape(x.shape[0], math.prod(x.shape[1:-1]), x.shape[-1])
    out, out_ = host_empty(*x3.shape, dtype=x.dtype)
    _rotate(numpy_of(x3.contiguous()), numpy_of(positions), cos, sin, inverse, out_)
    return out.view(x.shape)


@compiled(reassociate=True, ieee_division=True)
def _norm(x, weight, eps, out):
    """Each row's sum of squares in float64, vectorised (reassociated); the scaling multiplies
    only, which reassociation leaves as written."""
    rows, d = x.shape
    for r in range(rows):
        ss = 0.0
        for i in range(d):
            ss += np.float64(x[r, i]) * x[r, i]
        scale = 1.0 / np.sqrt(ss / d + eps)
        for i in range(d):
            out[r, i] = x[r, i] * scale * weight[i]


def _weight(norm: RMSNorm) -> np.ndarray:
    return prepared(norm, "_fast", lambda: numpy_of(upcast(norm.weight.detach())), norm.weight)


def rms_norm(norm: RMSNorm, x: torch.Tensor) -> torch.Tensor:
    """`norm(x)` for x [..., D]."""
    if not compiles(x):
        return norm(x)
    rows = x.reshape(-1, x.shape[-1])
    out, out_ = host_empty(*rows.shape, dtype=x.dtype)
    _norm(numpy_of(rows), _weight(norm), norm.eps, out_)
    return out.view(x.shape)


def norm_rotate(
    norm: RMSNorm, rope: RotaryEmbedding, x: torch.Tensor, positions: torch.Tensor
) -> torch.Tensor:
    """`rope(norm(x), positions)` for rows x [T, D]."""
    if not compiles(x):
        return rope(norm(x), positions)
    return rotate(rope, rms_norm(norm, x), positions)
