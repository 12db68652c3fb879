"""The attention phases (`model.attention.Attention`, MODEL.md §4.2–§4.6) with the fast pieces:
the same `project` / `select` / `attend` contract over a batch of requests and a `StateView`.

* `project`: RMSNorm, RoPE and the KV fake-quantisers as compiled loops (`fast.rope`,
  `fast.quant`), the linears as they are; a decode step's few tokens get the query and
  window-key projections, and a KV source's new entries, linears included, from one loop
  each (`fast.projection`).
* `select`: the window rows as the oracle's; an index source scores with queries from one
  loop for a decode step's few tokens (`fast.projection`) or the compiled RoPE, quantised by
  the compiled quantiser either way, and selects its rows' top-k in one compiled loop over their
  whole rows of scores (`fast.selection`; past 2^24 scores, the oracle's bounded scan).
* `attend`: the rows a forward reads are found with a mask over the pool, not a sort; a
  decode-sized batch gathers each token's rows (`attention.sparse_attention`; up to
  LOOP_SCORES scores, one compiled loop), a prefill block
  whose tokens share most of their rows attends the union of them with one masked GEMM per
  block, which is the same softmax over the same rows without a [T, W + k, Dh] gather; the
  block's runs of rows and its mask come from its ids in two compiled loops.
"""

from __future__ import annotations

from functools import partial

import numpy as np
import torch
import torch.nn.functional as F

from sglang_ds41.model.attention import (
    Attention,
    NewEntries,
    Projected,
    Published,
    StateView,
    sparse_attention,
)
from sglang_ds41.model.batch import Chunks
from sglang_ds41.model.compressor import Compressor
from sglang_ds41.model.indexer import Indexer, visible_counts
from sglang_ds41.model.norm import upcast
from sglang_ds41.model.roles import LayerRole
from sglang_ds41.model.selection import picks_every_entry

from . import projection, quant, selection
from .jit import compiled, compiles, host_empty, numpy_of
from .rope import norm_rotate, rms_norm, rotate

# Query rows per block of the union attention.
DENSE_ROWS = 256
# A prefill block gathers each token's rows instead when the union of its rows is wider than
# this many times a token's (a long context's top-k spread over many entries). Measured here:
# fused attention costs ~14 ns per query row and union row, the gather + GEMMs ~230 ns per
# query row and row it reads, so the union wins up to ~16x (at 8k tokens of context a block's
# union is ~7.5x its tokens' rows: 3.8 s of attention in a prefill instead of 6.1 s gathered).
UNION_WIDTH = 16
# Up to this many (token, head, row) scores the compiled loop runs, else `sparse_attention`,
# whose ops cost ~33 us a call and whose GEMMs scale better. The loop's float64 sums,
# vectorised, cost ~16-18 ns a score, most of it the scalar exp (one thread, 4 heads of 64,
# rows spread over a pool of 20,000): 1 token over 640 / 1,152 rows 0.045 / 0.082 ms against
# 0.10 / 0.16. Past it nothing was gained: the shipped model's decode step at batch 16
# (16 x 640 rows a layer) took the same time with the bound at 8,192 and at 100,000.
LOOP_SCORES = 8192


def project(
    attn: Attention, x: torch.Tensor, chunks: Chunks, pending: torch.Tensor | None = None
) -> Projected:
    """`attn.project(x, chunks, pending)`."""
    positions = chunks.positions
    query = projection.project_rows(attn, x, positions)  # a decode step's few tokens, one loop
    if query is None:
        q_lora = rms_norm(attn.q_norm, attn.wq_a(x))  # [T, q_lora_rank]
        q = rotate(attn.rope, attn.wq_b(q_lora).unflatten(-1, (attn.n_heads, attn.head_dim)), positions)
        kv = norm_rotate(attn.kv_norm, attn.rope, attn.wkv(x), positions)
    else:
        q_lora, q, kv = query
    window_kv, window_bytes = quant.window_fp8(kv)
    entries = None
    if attn.role is LayerRole.FULL:
        made = projection.entry_rows(attn, x, chunks, pending)  # a decode step's, one loop
        if made is None:
            latents, entry_positions, new_pending = _latents(attn.compressor, x, chunks, pending)
            indexer = attn.indexer
            key_rows = norm_rotate(indexer.k_norm, indexer.rope, indexer.wk(latents), entry_positions)
            rotated = rotate(attn.rope, latents, entry_positions)
        else:
            rotated, _, key_rows, new_pending = made
        keys, key_bytes = quant.index_fp4(key_rows)
        kv, kv_bytes = quant.latent_fp4(rotated)
        entries = NewEntries(rotated, kv, keys, new_pending, kv_bytes, key_bytes)
    return Projected(q_lora, q, window_kv, entries, window_bytes)


def _latents(
    compressor: Compressor, x: torch.Tensor, chunks: Chunks, pending: torch.Tensor | None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """`compressor.compress(x, chunks, pending)`, ratio 1 with the compiled norm."""
    if compressor.ratio == 1:
        return rms_norm(compressor.norm, compressor.wkv(x)), chunks.positions, None
    return compressor.compress(x, chunks, pending)


def queries(
    indexer: Indexer, x: torch.Tensor, q_lora: torch.Tensor, positions: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """`indexer.queries(x, q_lora, positions)`; a decode step's few tokens in one loop."""
    made = projection.index_rows(indexer, x, q_lora, positions)
    if made is None:
        q = indexer.wq_b(q_lora).unflatten(-1, (indexer.n_heads, indexer.head_dim))  # [T, Hi, Di]
        q = rotate(indexer.rope, q, positions)
        w = upcast(indexer.weights_proj(x)) * (indexer.head_dim**-0.5 * indexer.n_heads**-0.5)  # [T, Hi]
    else:
        q, w = made
    return quant.index_fp4(q)[0], w


def select(
    attn: Attention,
    x: torch.Tensor,
    projected: Projected,
    chunks: Chunks,
    view: StateView,
    published: Published,
) -> torch.Tensor:
    """`attn.select(x, projected, chunks, view, published)` with the fast index."""
    return attn.select(x, projected, chunks, view, published, index=partial(index, attn))


def index(
    attn: Attention,
    x: torch.Tensor,
    q_lora: torch.Tensor,
    chunks: Chunks,
    view: StateView,
    published: Published,
) -> torch.Tensor:
    """`attn.index(x, q_lora, chunks, view, published)` with the fast queries; a decode step
    (one token per request) whose scores fit one block of entries scores them as the oracle's
    scan does and selects in one compiled loop (`fast.selection`)."""
    tokens, requests = x.shape[0], chunks.size
    n_visible = visible_counts(chunks.positions, attn.ratio)  # [T]
    n_cols = int(n_visible.max()) if tokens else 0
    publish, allowed = attn.candidate_rule(published)
    if (
        tokens != requests
        or n_cols > attn.column_block(requests, tokens)
        or not compiles(x)
        or picks_every_entry(n_visible, attn.index_topk, publish)  # the oracle scores nothing
    ):
        return attn.index(x, q_lora, chunks, view, published, queries=queries, scan=selection.scan)
    q, w = queries(attn.indexer, x, q_lora, chunks.positions)  # [T, Hi, Di], [T, Hi]
    counts, first = chunks.entry_counts(attn.ratio), chunks.entry_offsets(attn.ratio)[:-1]
    scores = torch.empty(tokens, 0, dtype=w.dtype)  # no entry seen yet: nothing is scored
    if n_cols:
        scores = attn.scorer(q[:, None], w[:, None], view, first, counts)(0, n_cols)  # [T, n_cols]
    restrict = None if allowed is None else (allowed, attn.candidate_block_size)
    picked, kept = selection.select_block(
        scores, n_visible, first, attn.index_topk, attn.index_width(chunks), publish, restrict
    )
    return attn.publish(published, picked, kept)


def attend(
    attn: Attention, projected: Projected, chunks: Chunks, view: StateView, ids: torch.Tensor
) -> torch.Tensor:
    """`attn.attend(projected, chunks, view, ids)`: the pool is the window rows, then the entries
    picked, decoded once: in pick order when each request has one token (a decode step, where
    no entry is picked twice: nothing to sort or look up over all the entries), else in entry
    order, or all the batch's entries when the picks are as many (a prefill): then the ids need
    no renumbering. A decode step's attention gathers each token's rows and sums over its ids'
    columns in order (`gathered_attention`), so where its rows sit in the pool does not change
    a bit."""
    n_window = int(chunks.window_offsets(attn.window)[-1])
    pool = view.window()  # [n_window, Dh]
    if ids.shape[1] > attn.window and ids.numel():  # entry columns after the window's
        entries = ids[:, attn.window :] - n_window  # [T, k] entry rows, < 0 = none
        n_entries = int(chunks.entry_offsets(attn.ratio)[-1])
        if entries.numel() >= n_entries:
            pool = torch.cat([pool, view.rows(torch.arange(n_entries)).to(pool.dtype)])
        elif ids.shape[0] == chunks.size:  # one token per request: each pick gets its own row
            picked = entries >= 0
            pool = torch.cat([pool, view.rows(entries[picked]).to(pool.dtype)])
            rank = torch.cumsum(picked.flatten(), 0).view_as(entries) + (n_window - 1)
            ids = torch.cat([ids[:, : attn.window], torch.where(picked, rank, -1)], 1)
        else:
            present = torch.zeros(n_entries, dtype=torch.bool)
            present[entries[entries >= 0]] = True
            pool = torch.cat([pool, view.rows(present.nonzero().flatten()).to(pool.dtype)])
            rank = n_window + present.cumsum(0) - 1
            ids = torch.cat(
                [ids[:, : attn.window], torch.where(entries >= 0, rank[entries.clamp(min=0)], -1)], 1
            )
    o = attention(projected.q, pool, ids, attn.attn_sink, attn.softmax_scale, attn.window)  # [T, H, Dh]
    return project_out(attn, o, chunks.positions)


def attention(
    q: torch.Tensor, pool: torch.Tensor, ids: torch.Tensor, sink: torch.Tensor, scale: float, window: int
) -> torch.Tensor:
    """`attention.sparse_attention(q, pool, ids, sink, scale)` for ids [T, window + k] (the window
    rows, then entry rows), block by block of query rows: a block whose tokens share their rows
    attends the two runs of pool rows they reach (window rows, entry rows) through masked fused
    attention, a block that would use little of them gathers each token's rows."""
    t, k = ids.shape
    if t < DENSE_ROWS // 4:
        return gathered_attention(q, pool, ids, sink, scale)
    ids = ids.contiguous()
    runs = torch.empty(-(-t // DENSE_ROWS), 4, dtype=torch.int64)  # per block: window lo, hi, entries lo, hi
    _block_runs(numpy_of(ids), window, DENSE_ROWS, numpy_of(runs))
    out = torch.empty_like(q)
    dtype = upcast(q).dtype
    for block, (lo_w, hi_w, lo_e, hi_e) in enumerate(runs.tolist()):
        r0, r1 = block * DENSE_ROWS, min(t, (block + 1) * DENSE_ROWS)
        width = (hi_w - lo_w) + (hi_e - lo_e)
        if width == 0 or width > UNION_WIDTH * k:  # the union is mostly rows no token reads
            out[r0:r1] = gathered_attention(q[r0:r1], pool, ids[r0:r1], sink, scale)
            continue
        mask = torch.empty(r1 - r0, width, dtype=dtype)
        _union_mask(numpy_of(ids), r0, window, lo_w, lo_e, hi_w - lo_w, numpy_of(mask))
        kv = torch.cat([pool[lo_w:hi_w], pool[lo_e:hi_e]])
        out[r0:r1] = _union_attention(q[r0:r1], kv, mask, sink, scale)
    return out


@compiled
def _block_runs(ids, window, rows, runs):
    """runs[b] = the pool rows [lo, hi) of the window ids, then of the entry ids, of each block
    of `rows` rows of ids [T, K] (-1 = none; (0, 0) for a part without ids)."""
    t, k = ids.shape
    for b in range(runs.shape[0]):
        lo_w, hi_w, lo_e, hi_e = np.iinfo(np.int64).max, -1, np.iinfo(np.int64).max, -1
        for i in range(b * rows, min(t, (b + 1) * rows)):
            for j in range(k):
                v = ids[i, j]
                if v < 0:
                    continue
                if j < window:
                    lo_w, hi_w = min(lo_w, v), max(hi_w, v)
                else:
                    lo_e, hi_e = min(lo_e, v), max(hi_e, v)
        runs[b, 0], runs[b, 1] = (lo_w, hi_w + 1) if hi_w >= 0 else (0, 0)
        runs[b, 2], runs[b, 3] = (lo_e, hi_e + 1) if hi_e >= 0 else (0, 0)


@compiled
def _union_mask(ids, r0, window, lo_w, lo_e, n_window, mask):
    """mask [R, U] for rows r0.. of ids: 0 at each row's ids (a window id at id - lo_w, an entry
    id at n_window + id - lo_e), -inf elsewhere."""
    for i in range(mask.shape[0]):
        mask[i, :] = -np.inf
        for j in range(ids.shape[1]):
            v = ids[r0 + i, j]
            if v >= 0:
                mask[i, v - lo_w if j < window else n_window + v - lo_e] = 0.0


@compiled(reassociate=True)
def _gathered(q, pool, ids, sink, scale, out):
    """Each token's softmax over its rows of the pool and the sink, accumulated in float64
    (the dot products' sums vectorised: `compiled`'s reassociate). The heads share each row
    as it is read (a quarter fewer cycles at 4 heads than a pass per head); every (token,
    head)'s sums run over its rows in order as before."""
    t_rows, heads, dh = q.shape
    k = ids.shape[1]
    s = np.empty((heads, k))
    qd = np.empty((heads, dh))
    top = np.empty(heads)
    total = np.empty(heads)
    acc = np.empty((heads, dh))
    for t in range(t_rows):
        for h in range(heads):
            top[h] = sink[h]
            for i in range(dh):
                qd[h, i] = q[t, h, i]
        for j in range(k):
            row = ids[t, j]
            if row < 0:
                continue
            for h in range(heads):
                v = 0.0
                for i in range(dh):
                    v += qd[h, i] * pool[row, i]
                s[h, j] = v * scale
                top[h] = max(top[h], s[h, j])
        for h in range(heads):
            total[h] = np.exp(sink[h] - top[h])
            acc[h, :] = 0.0
        for j in range(k):
            row = ids[t, j]
            if row < 0:
                continue
            for h in range(heads):
                e = np.exp(s[h, j] - top[h])
                total[h] += e
                for i in range(dh):
                    acc[h, i] += e * pool[row, i]
        for h in range(heads):
            for i in range(dh):
                out[t, h, i] = acc[h, i] / total[h]


def gathered_attention(
    q: torch.Tensor, pool: torch.Tensor, ids: torch.Tensor, sink: torch.Tensor, scale: float
) -> torch.Tensor:
    """`attention.sparse_attention(q, pool, ids, sink, scale)`, as one compiled loop when it
    is small (a decode step over a short window and few picks), else that function."""
    if not (compiles(q) and pool.dtype == q.dtype) or ids.numel() * q.shape[1] > LOOP_SCORES:
        return sparse_attention(q, pool, ids, sink, scale)
    out, out_ = host_empty(*q.shape, dtype=q.dtype)
    _gathered(
        numpy_of(q.contiguous()), numpy_of(pool.contiguous()), numpy_of(ids.contiguous()),
        numpy_of(upcast(sink)), scale, out_,
    )  # fmt: skip
    return out


def _union_attention(
    q: torch.Tensor, kv: torch.Tensor, mask: torch.Tensor, sink: torch.Tensor, scale: float
) -> torch.Tensor:
    """q [T, H, Dh] over `kv` [U, Dh], each token only where its row of `mask` [T, U] is 0 (-inf
    elsewhere), -> [T, H, Dh]: torch's fused CPU attention, then the sink:
    sum_j e^s_j v_j / (sum_j e^s_j + e^sink) = o * sigmoid(lse - sink)."""
    h, u, dtype = q.shape[1], kv.shape[0], mask.dtype
    kv = upcast(kv)[None, None].expand(1, h, u, -1)
    o, lse = _FLASH(upcast(q).transpose(0, 1)[None], kv, kv, attn_mask=mask[None, None], scale=scale)
    o = o[0] * torch.sigmoid(lse[0] - upcast(sink).to(dtype)[:, None])[..., None]  # [H, T, Dh]
    return o.transpose(0, 1).to(q.dtype)


_FLASH = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu


def project_out(attn: Attention, o: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """`attn.project_out(o, positions)`: undo the query RoPE, then the grouped low-rank output
    (a decode step's few tokens in one loop, `fast.projection`)."""
    y = projection.output_rows(attn, o, positions)
    if y is not None:
        return y
    o = rotate(attn.rope, o, positions, inverse=True)  # [T, H, Dh]
    o = o.flatten(1).unflatten(-1, (attn.groups, -1)).transpose(0, 1)  # [G, T, H*Dh/G]
    wo_a = attn.wo_a.weight.unflatten(0, (attn.groups, -1))  # [G, o_lora_rank, H*Dh/G]
    u = torch.bmm(o, wo_a.transpose(1, 2))  # [G, T, o_lora_rank]
    return F.linear(u.transpose(0, 1).flatten(1), attn.wo_b.weight)
