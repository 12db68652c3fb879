"""The attention's projections (`model.attention.Attention.project`, MODEL.md §4.2, §4.4)
for a decode step's few tokens, as compiled loops, one per layer and kind:

    q_lora    = RMSNorm_q(x W_qa^T)
    q         = RoPE(q_lora W_qb^T)            per head, at the token's position
    window_kv = RoPE(RMSNorm_kv(x W_kv^T))     (before its FP8 fake quantisation)

and, on a KV source, the entries the step completes (`model.compressor.Compressor.compress`,
`Indexer.keys`; ratio 2 when each request brings one token):

    latent    = RMSNorm_c(a), a = x W_ckv^T; at ratio 2 RMSNorm_c of the pair's a weighted per
                channel by the softmax over the pair of z = x W_gate^T
    rotated   = RoPE(latent)                   at the entry's position (before its FP4 quantisation)
    key       = RoPE(RMSNorm_k(latent W_k^T))  (before its FP4 quantisation)

an index source's queries (`model.indexer.Indexer.queries`):

    q^I       = RoPE(q_lora W_qb^I^T)          per index head (before its FP4 quantisation)
    w         = (x W_w^T) / sqrt(Di * Hi)      the heads' weights

and the way back from the attention's output (`Attention.project_out`):

    y         = (RoPE^-1(o) grouped W_oa^T) W_ob^T

At the tiny and trained sizes each is 2-40 thousand multiply-adds a token (microseconds),
where the calls they take apart (linears, the norms and rotations of `fast.rope`, the
compressor's ~25 ops) cost ~75 us a layer in call overhead alone, ~250 us for a ratio-2
compressor (one thread, the tiny size). The loops' arithmetic is the pieces': every dot
product a float sum of its row (reassociated, so vectorised), each norm's sum of squares in
float64 as `fast.rope` sums it, the rotation and the pair's softmax in the model's dtype. A
token's rows depend on that token (and its request's pending one) alone, so a request gets the
same bits in any batch the loops take. They read each weight once per token, where a GEMM
reads it once per call: past LOOP_TOKENS tokens or LOOP_MACS multiply-adds a call (a real
checkpoint's layers at any batch) the pieces run as before.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import TypeVar

import numpy as np
import torch
from torch import nn

from sglang_ds41.model.attention import Attention
from sglang_ds41.model.batch import Chunks
from sglang_ds41.model.indexer import Indexer
from sglang_ds41.model.norm import upcast

from .jit import compiled, compiles, host_empty, numpy_of, prepared
from .rope import tables

# Up to this many tokens, and this many multiply-adds a call, a layer's projections run as the
# loop. Measured (one thread): 16 tokens at the trained shape (~33k a token for the query side)
# 98 us in the loop against 131 us for 17 tokens as pieces.
LOOP_TOKENS = 16
LOOP_MACS = 1 << 20

M = TypeVar("M", bound=nn.Module)


def project_rows(
    attn: Attention, x: torch.Tensor, positions: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None:
    """(q_lora [T, q_lora_rank], q [T, H, Dh], window KV [T, Dh] before its quantisation) of
    x [T, D], or None when the loop does not take them (too many tokens, a dtype the loops do
    not compile, linears that are not plain dense ones in x's dtype)."""
    weights = _loop_weights(attn, x, "_projection", _weights, _QUERY)
    if weights is None:
        return None
    wq_a, q_weight, wq_b, wkv, kv_weight = weights
    tokens = x.shape[0]
    q_lora, q_lora_ = host_empty(tokens, wq_a.shape[0], dtype=x.dtype)
    q, q_ = host_empty(tokens, wq_b.shape[0], dtype=x.dtype)
    kv, kv_ = host_empty(tokens, wkv.shape[0], dtype=x.dtype)
    cos, sin = tables(attn.rope, positions, x.dtype)
    _project(
        numpy_of(x.contiguous()), wq_a, q_weight, attn.q_norm.eps, wq_b, attn.head_dim, wkv, kv_weight,
        attn.kv_norm.eps, numpy_of(positions), cos, sin, q_lora_, q_, kv_,
    )  # fmt: skip
    return q_lora, q.view(tokens, -1, attn.head_dim), kv


def entry_rows(
    attn: Attention, x: torch.Tensor, chunks: Chunks, pending: torch.Tensor | None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None] | None:
    """A KV source's new entries from x [T, D] (`chunks`' rows; `pending` [B, 2, Dh]: each
    request's unpaired even token, ratio 2): (rotated latents [G, Dh], entry positions [G],
    index keys [G, Di] before their quantisation, new pending [B, 2, Dh] or None, as
    `Compressor.compress` gives it), or None when the loop does not take them (too many
    tokens, a ratio-2 chunk of more than one token, an odd position without its pending token,
    a dtype or linears the loop does not take)."""
    compressor, tokens = attn.compressor, x.shape[0]
    positions = chunks.positions
    if compressor.ratio == 2 and (tokens != chunks.size or (pending is None and bool((positions % 2).any()))):
        return None
    weights = _loop_weights(attn, x, "_entries", _entry_weights, _ENTRY)
    if weights is None:
        return None
    wkv, wgate, latent_weight, wk, key_weight = weights
    cos, sin = tables(attn.rope, positions, x.dtype)
    rotated, rotated_ = host_empty(tokens, wkv.shape[0], dtype=x.dtype)
    keys, keys_ = host_empty(tokens, wk.shape[0], dtype=x.dtype)
    entry_positions, entry_positions_ = host_empty(tokens, dtype=torch.int64)
    new_pending = torch.zeros(tokens if compressor.ratio == 2 else 0, 2, wkv.shape[0], dtype=x.dtype)
    held = x.new_zeros(0, 2, 0) if pending is None else pending.to(x.dtype).contiguous()
    entries, unpaired = _entries(
        numpy_of(x.contiguous()), numpy_of(positions), compressor.ratio, wkv, wgate, latent_weight,
        compressor.norm.eps, numpy_of(held), wk, key_weight, attn.indexer.k_norm.eps, cos, sin,
        rotated_, entry_positions_, keys_, numpy_of(new_pending),
    )  # fmt: skip
    # (the caller stores the rows only; the positions say which tokens made entries)
    return rotated[:entries], entry_positions[:entries], keys[:entries], new_pending if unpaired else None


def index_rows(
    indexer: Indexer, x: torch.Tensor, q_lora: torch.Tensor, positions: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor] | None:
    """(index queries q^I [T, Hi, Di] before their quantisation, head weights w [T, Hi]) of
    x [T, D] and q_lora [T, q_lora_rank], or None when the loop does not take them."""
    if q_lora.dtype != x.dtype:
        return None
    weights = _loop_weights(indexer, x, "_index", _index_weights, _INDEX)
    if weights is None:
        return None
    wq_b, w_heads = weights
    tokens, heads = x.shape[0], indexer.n_heads
    q, q_ = host_empty(tokens, wq_b.shape[0], dtype=x.dtype)
    w, w_ = host_empty(tokens, heads, dtype=x.dtype)
    scale = wq_b.dtype.type(indexer.head_dim**-0.5 * heads**-0.5)
    cos, sin = tables(indexer.rope, positions, x.dtype)
    _index(
        numpy_of(x.contiguous()), numpy_of(q_lora.contiguous()), wq_b, indexer.head_dim, w_heads, scale,
        numpy_of(positions), cos, sin, q_, w_,
    )  # fmt: skip
    return q.view(tokens, heads, indexer.head_dim), w


def output_rows(attn: Attention, o: torch.Tensor, positions: torch.Tensor) -> torch.Tensor | None:
    """`attn.project_out(o, positions)` of o [T, H, Dh], or None when the loop does not take it."""
    weights = _loop_weights(attn, o, "_output", _output_weights, _OUTPUT)
    if weights is None:
        return None
    wo_a, wo_b = weights
    cos, sin = tables(attn.rope, positions, o.dtype)
    y, y_ = host_empty(o.shape[0], wo_b.shape[0], dtype=o.dtype)
    rows, shape = numpy_of(o.flatten(1).contiguous()), (attn.head_dim, attn.groups)
    _output(rows, numpy_of(positions), cos, sin, *shape, wo_a, wo_b, y_)
    return y


# The modules whose `weight` each loop's copy is made from (the ratio-1 compressor has no gate).
_QUERY = ("wq_a", "q_norm", "wq_b", "wkv", "kv_norm")
_ENTRY = ("compressor.wkv", "compressor.wgate", "compressor.norm", "indexer.wk", "indexer.k_norm")
_OUTPUT = ("wo_a", "wo_b")
_INDEX = ("wq_b", "weights_proj")


def _loop_weights(
    module: M,
    rows: torch.Tensor,
    name: str,
    build: Callable[[M, torch.dtype], tuple[np.ndarray, ...] | None],
    watched: tuple[str, ...],
) -> tuple[np.ndarray, ...] | None:
    """A loop's weights (`build`'s copy, kept on the module as `name`) for the tokens of `rows`,
    or None when the loop does not take them: too many tokens or multiply-adds, a dtype the
    loops do not compile, linears that are not plain dense ones in that dtype."""
    if rows.shape[0] > LOOP_TOKENS or not compiles(rows):
        return None
    dtype = rows.dtype
    weights = prepared(module, f"{name}_{dtype}", lambda: build(module, dtype), *_watched(module, watched))
    return weights if weights is not None and _fits(rows.shape[0], weights) else None


def _watched(owner: nn.Module, names: tuple[str, ...]) -> tuple[torch.Tensor, ...]:
    """The weights of `names` that exist as plain parameters, read from the modules' own tables:
    this runs every layer of every step, and `nn.Module`'s attribute lookup cost ~6 us for ten.
    (A module without one, e.g. a parametrized linear, is not plain: no loop takes its layer.)"""
    found = []
    for name in names:
        module = owner
        for part in name.split("."):
            module = module._modules.get(part) if module is not None else None
        weight = None if module is None else module._parameters.get("weight")
        if weight is not None:
            found.append(weight)
    return tuple(found)


def _fits(tokens: int, weights: tuple[np.ndarray, ...]) -> bool:
    """Within LOOP_MACS: each token reads every linear's weight once (the norms' are vectors)."""
    return tokens * sum(w.size for w in weights if w.ndim == 2) <= LOOP_MACS


def _weights(attn: Attention, dtype: torch.dtype) -> tuple[np.ndarray, ...] | None:
    """The layer's query-side weights as the loop reads them (norm weights upcast as the norms
    do), or None when a linear is not a plain dense one in `dtype`."""
    if not _plain(dtype, attn.wq_a, attn.wq_b, attn.wkv):
        return None
    q, kv = _norm_weight(attn.q_norm), _norm_weight(attn.kv_norm)
    return _dense(attn.wq_a), q, _dense(attn.wq_b), _dense(attn.wkv), kv


def _entry_weights(attn: Attention, dtype: torch.dtype) -> tuple[np.ndarray, ...] | None:
    """The KV source's compressor and index-key weights (an empty gate at ratio 1), or None."""
    compressor, indexer = attn.compressor, attn.indexer
    gate = compressor.wgate
    if not _plain(dtype, compressor.wkv, indexer.wk, *(() if gate is None else (gate,))):
        return None
    wkv = _dense(compressor.wkv)
    gate_rows = wkv[:0, :0] if gate is None else _dense(gate)
    latent, key = _norm_weight(compressor.norm), _norm_weight(indexer.k_norm)
    return wkv, gate_rows, latent, _dense(indexer.wk), key


def _output_weights(attn: Attention, dtype: torch.dtype) -> tuple[np.ndarray, ...] | None:
    """The grouped low-rank output's weights, or None."""
    if not _plain(dtype, attn.wo_a, attn.wo_b):
        return None
    return _dense(attn.wo_a), _dense(attn.wo_b)


def _index_weights(indexer: Indexer, dtype: torch.dtype) -> tuple[np.ndarray, ...] | None:
    """The index queries' and head weights' linears, or None."""
    if not _plain(dtype, indexer.wq_b, indexer.weights_proj):
        return None
    return _dense(indexer.wq_b), _dense(indexer.weights_proj)


def _plain(dtype: torch.dtype, *linears: nn.Module) -> bool:
    return all(type(m) is nn.Linear and m.bias is None and m.weight.dtype == dtype for m in linears)


def _dense(linear: nn.Linear) -> np.ndarray:
    return numpy_of(linear.weight.detach().contiguous())


def _norm_weight(norm: nn.Module) -> np.ndarray:
    return numpy_of(upcast(norm.weight.detach()).contiguous())


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
            _rotate(q[t], start, head_dim, cos[p], sin[p], False)
        _linear(x[t], wkv, kv[t])
        _normalise(kv[t], kv_weight, kv_eps)
        _rotate(kv[t], 0, kv.shape[1], cos[p], sin[p], False)


@compiled(reassociate=True, ieee_division=True)
def _entries(x, positions, ratio, wkv, wgate, latent_weight, latent_eps, pending, wk, key_weight, key_eps,
             cos, sin, rotated, entry_positions, keys, new_pending):  # fmt: skip
    """Each token's entry (module doc) into the next rows of rotated / entry_positions / keys;
    at ratio 2 an even token's (a, z) goes to its request's row of new_pending instead (one
    token per request). Returns (entries written, tokens left unpaired)."""
    dh = wkv.shape[0]
    a = np.empty(dh, x.dtype)
    z = np.empty(dh, x.dtype)
    latent = np.empty(dh, x.dtype)
    entries = unpaired = 0
    for t in range(x.shape[0]):
        p = positions[t]
        _linear(x[t], wkv, a)
        if ratio == 2:
            _linear(x[t], wgate, z)
            if p % 2 == 0:
                for i in range(dh):
                    new_pending[t, 0, i] = a[i]
                    new_pending[t, 1, i] = z[i]
                unpaired += 1
                continue
            for i in range(dh):  # softmax over the pair (the pending even token first), per channel
                top = max(pending[t, 1, i], z[i])
                first, second = math.exp(pending[t, 1, i] - top), math.exp(z[i] - top)
                total = first + second
                latent[i] = first / total * pending[t, 0, i] + second / total * a[i]
            p -= 1
        else:
            latent[:] = a
        _normalise(latent, latent_weight, latent_eps)
        rotated[entries] = latent
        _rotate(rotated[entries], 0, dh, cos[p], sin[p], False)
        _linear(latent, wk, keys[entries])
        _normalise(keys[entries], key_weight, key_eps)
        _rotate(keys[entries], 0, keys.shape[1], cos[p], sin[p], False)
        entry_positions[entries] = p
        entries += 1
    return entries, unpaired


@compiled(reassociate=True)
def _index(x, q_lora, wq_b, head_dim, w_heads, scale, positions, cos, sin, q, w):
    """Each token's index queries, rotated per head, into q, and its head weights times the
    scale into w. The scale comes in the model's dtype: torch multiplies a float32 tensor by a
    Python float rounded to float32 first, so a float64 product rounded once would differ."""
    for t in range(x.shape[0]):
        p = positions[t]
        _linear(q_lora[t], wq_b, q[t])
        for start in range(0, q.shape[1], head_dim):
            _rotate(q[t], start, head_dim, cos[p], sin[p], False)
        _linear(x[t], w_heads, w[t])
        for h in range(w.shape[1]):
            w[t, h] = w[t, h] * scale


@compiled(reassociate=True)
def _output(o, positions, cos, sin, head_dim, groups, wo_a, wo_b, y):
    """Each token's row of o [T, H * Dh] rotated back per head (in a copy), each group's slice
    through its rows of wo_a, the groups' results in order through wo_b, into y."""
    width = o.shape[1] // groups
    rank = wo_a.shape[0] // groups
    row = np.empty(o.shape[1], o.dtype)
    u = np.empty(wo_a.shape[0], o.dtype)
    for t in range(o.shape[0]):
        p = positions[t]
        row[:] = o[t]
        for start in range(0, o.shape[1], head_dim):
            _rotate(row, start, head_dim, cos[p], sin[p], True)
        for g in range(groups):
            part, rows = slice(g * width, (g + 1) * width), slice(g * rank, (g + 1) * rank)
            _linear(row[part], wo_a[rows], u[rows])
        _linear(u, wo_b, y[t])


# One row's linear, RMSNorm and RoPE: `fast.rope`'s loops restated for a row, since a compiled
# loop calls compiled code of its own file only (`fast.jit.compiled`).


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
def _rotate(row, start, width, cos, sin, inverse):
    """RoPE in place on the last 2 * len(cos) channels of row[start : start + width] (or back:
    as `fast.rope` spells the inverse, a - b * (-s) is a + b * s exactly)."""
    half = cos.shape[0]
    first = start + width - 2 * half
    for i in range(half):
        c, s = cos[i], sin[i]
        even, odd = row[first + 2 * i], row[first + 2 * i + 1]
        if inverse:
            row[first + 2 * i] = even * c + odd * s
            row[first + 2 * i + 1] = odd * c - even * s
        else:
            row[first + 2 * i] = even * c - odd * s
            row[first + 2 * i + 1] = even * s + odd * c
