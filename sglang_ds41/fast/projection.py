"""The attention's query and window-key projections (`model.attention.Attention.project`,
MODEL.md §4.2) for a decode step's few tokens, as one compiled loop per layer:

    q_lora    = RMSNorm_q(x W_qa^T)
    q         = RoPE(q_lora W_qb^T)            per head, at the token's position
    window_kv = RoPE(RMSNorm_kv(x W_kv^T))     (before its FP8 fake quantisation)

Each is a few hundred multiply-adds a token at these sizes, where the six calls they take
apart (three linears, the norms and rotations of `fast.rope`) cost ~75 us a layer in call
overhead alone (one thread, the tiny size). The loop's arithmetic is the pieces': every
dot product a float sum of its row (reassociated, so vectorised), each norm's sum of squares
in float64 as `fast.rope` sums it, the rotation in the model's dtype; a token's rows depend on
that token alone, so a request gets the same bits in any batch. Past LOOP_TOKENS the GEMMs of
the pieces win, and they take it.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from sglang_ds41.model.attention import Attention
from sglang_ds41.model.norm import upcast

from .jit import compiled, compiles, numpy_of, prepared
from .rope import tables

# Up to this many tokens a layer's projections run as the one loop.
LOOP_TOKENS = 16


def project_rows(
    attn: Attention, x: torch.Tensor, positions: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None:
    """(q_lora [T, q_lora_rank], q [T, H, Dh], window KV [T, Dh] before its quantisation) of
    x [T, D], or None when the loop does not take them (too many tokens, a dtype the loops do
    not compile, linears that are not plain dense ones in x's dtype)."""
    if x.shape[0] > LOOP_TOKENS or not compiles(x):
        return None
    weights = prepared(attn, f"_projection_{x.dtype}", lambda: _weights(attn, x.dtype), *_watched(attn))
    if weights is None:
        return None
    wq_a, q_weight, wq_b, wkv, kv_weight = weights
    tokens = x.shape[0]
    q_lora = torch.empty(tokens, wq_a.shape[0], dtype=x.dtype)
    q = torch.empty(tokens, wq_b.shape[0], dtype=x.dtype)
    kv = torch.empty(tokens, wkv.shape[0], dtype=x.dtype)
    cos, sin = tables(attn.rope, positions, x.dtype)
    _project(
        numpy_of(x.contiguous()), wq_a, q_weight, attn.q_norm.eps, wq_b, attn.head_dim, wkv, kv_weight,
        attn.kv_norm.eps, numpy_of(positions), cos, sin, numpy_of(q_lora), numpy_of(q), numpy_of(kv),
    )  # fmt: skip
    return q_lora, q.view(tokens, -1, attn.head_dim), kv


def _watched(attn: Attention) -> tuple[torch.Tensor, ...]:
    """The weights the loop's copy is made from. Read from the modules' own tables: this runs
    every layer of every step, and `nn.Module`'s attribute lookup cost ~6 us for the ten."""
    modules = attn._modules
    return tuple(modules[name]._parameters["weight"] for name in _WATCHED)


_WATCHED = ("wq_a", "q_norm", "wq_b", "wkv", "kv_norm")


def _weights(attn: Attention, dtype: torch.dtype) -> tuple[np.ndarray, ...] | None:
    """The layer's projection weights as the loop reads them (norm weights upcast as the norms
    do), or None when a linear is not a plain dense one in `dtype`."""
    linears = (attn.wq_a, attn.wq_b, attn.wkv)
    if any(type(m) is not nn.Linear or m.bias is not None or m.weight.dtype != dtype for m in linears):
        return None
    dense = lambda m: numpy_of(m.weight.detach().contiguous())  # noqa: E731
    norm = lambda n: numpy_of(upcast(n.weight.detach()).contiguous())  # noqa: E731
    return dense(attn.wq_a), norm(attn.q_norm), dense(attn.wq_b), dense(attn.wkv), norm(attn.kv_norm)


@compiled(reassociate=True, ieee_division=True)
def _project(x, wq_a, q_weight, q_eps, wq_b, head_dim, wkv, kv_weight, kv_eps, positions, cos, sin,
             q_lora, q, kv):  # fmt: skip
    """The three projections of each token (module doc), into q_lora, q and kv."""
    tokens = x.shape[0]
    for t in range(tokens):
        p = positions[t]
        _linear(x[t], wq_a, q_lora[t])
        _normalise(q_lora[t], q_weight, q_eps)
        _linear(q_lora[t], wq_b, q[t])
        for start in range(0, q.shape[1], head_dim):
            _rotate(q[t], start, head_dim, cos[p], sin[p])
        _linear(x[t], wkv, kv[t])
        _normalise(kv[t], kv_weight, kv_eps)
        _rotate(kv[t], 0, kv.shape[1], cos[p], sin[p])


@compiled(reassociate=True)
def _linear(row, weight, out):
    """out = weight @ row: each entry one dot product, its sum vectorised."""
    for j in range(weight.shape[0]):
        s = row[0] * weight[j, 0]
        for i in range(1, row.shape[0]):
            s += row[i] * weight[j, i]
        out[j] = s


@compiled(reassociate=True, ieee_division=True)
def _normalise(row, weight, eps):
    """RMSNorm in place: the sum of squares in float64, then x * scale * weight."""
    d = row.shape[0]
    ss = 0.0
    for i in range(d):
        ss += np.float64(row[i]) * row[i]
    scale = 1.0 / np.sqrt(ss / d + eps)
    for i in range(d):
        row[i] = row[i] * scale * weight[i]


@compiled
def _rotate(row, start, width, cos, sin):
    """RoPE in place on the last 2 * len(cos) channels of row[start : start + width]."""
    half = cos.shape[0]
    first = start + width - 2 * half
    for i in range(half):
        c, s = cos[i], sin[i]
        even, odd = row[first + 2 * i], row[first + 2 * i + 1]
        row[first + 2 * i] = even * c - odd * s
        row[first + 2 * i + 1] = even * s + odd * c
