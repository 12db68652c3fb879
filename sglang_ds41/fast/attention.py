"""The attention phases (`model.attention.Attention`, MODEL.md §4.2–§4.6) with the fast pieces:
the same `project` / `select` / `attend` contract over a batch of requests and a `StateView`.

* `project`: RMSNorm, RoPE and the KV fake-quantisers as compiled loops (`fast.rope`,
  `fast.quant`); the linears as they are.
* `select`: the window rows as the oracle's; an index source scores with queries from the
  compiled RoPE and quantiser, then the oracle's bounded block scan (`selection.select_rows`).
* `attend`: the rows a forward reads are found with a mask over the pool, not a sort; a
  decode-sized batch gathers each token's rows (`attention.sparse_attention`), a prefill block
  whose tokens share most of their rows attends the union of them with one masked GEMM per
  block, which is the same softmax over the same rows without a [T, W + k, Dh] gather.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from sglang_ds41.errors import Ds41Error
from sglang_ds41.model.attention import (
    Attention,
    NewEntries,
    Projected,
    Published,
    StateView,
    sparse_attention,
    window_ids,
)
from sglang_ds41.model.batch import Chunks
from sglang_ds41.model.indexer import Indexer, visible_counts
from sglang_ds41.model.norm import upcast
from sglang_ds41.model.roles import LayerRole
from sglang_ds41.model.selection import Candidates, select_rows

from . import quant
from .rope import norm_rotate, rms_norm, rotate

# Query rows per block of the union attention, and the most scores [rows, heads, union] it
# holds at once (16 MiB in float32).
DENSE_ROWS = 256
DENSE_SCORES = 1 << 22


def project(
    attn: Attention, x: torch.Tensor, chunks: Chunks, pending: torch.Tensor | None = None
) -> Projected:
    """`attn.project(x, chunks, pending)`."""
    positions = chunks.positions
    q_lora = rms_norm(attn.q_norm, attn.wq_a(x))  # [T, q_lora_rank]
    q = rotate(attn.rope, attn.wq_b(q_lora).unflatten(-1, (attn.n_heads, attn.head_dim)), positions)
    window_kv, _ = quant.window_fp8(norm_rotate(attn.kv_norm, attn.rope, attn.wkv(x), positions))
    entries = None
    if attn.role is LayerRole.FULL:
        compressor = attn.compressor
        if compressor.ratio == 1:
            latents, entry_positions, new_pending = (
                rms_norm(compressor.norm, compressor.wkv(x)),
                positions,
                None,
            )
        else:
            latents, entry_positions, new_pending = compressor.compress(x, chunks, pending)
        keys = index_keys(attn.indexer, latents, entry_positions)
        rotated = rotate(attn.rope, latents, entry_positions)
        entries = NewEntries(rotated, quant.latent_fp4(rotated)[0], keys, new_pending)
    return Projected(q_lora, q, window_kv, entries)


def index_keys(indexer: Indexer, latents: torch.Tensor, entry_positions: torch.Tensor) -> torch.Tensor:
    """`indexer.keys(latents, entry_positions)`."""
    return quant.index_fp4(norm_rotate(indexer.k_norm, indexer.rope, indexer.wk(latents), entry_positions))[0]


def queries(
    indexer: Indexer, x: torch.Tensor, q_lora: torch.Tensor, positions: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """`indexer.queries(x, q_lora, positions)`."""
    q = indexer.wq_b(q_lora).unflatten(-1, (indexer.n_heads, indexer.head_dim))  # [T, Hi, Di]
    q = quant.index_fp4(rotate(indexer.rope, q, positions))[0]
    w = upcast(indexer.weights_proj(x)) * (indexer.head_dim**-0.5 * indexer.n_heads**-0.5)  # [T, Hi]
    return q, w


def select(
    attn: Attention,
    x: torch.Tensor,
    projected: Projected,
    chunks: Chunks,
    view: StateView,
    published: Published,
) -> torch.Tensor:
    """`attn.select(x, projected, chunks, view, published)`."""
    ids = window_ids(chunks, attn.window)  # [T, W]
    if attn.role is LayerRole.WINDOW:
        return ids
    if attn.role is LayerRole.REUSE:
        entries = attn._borrow(published.selection, attn.index_source, "top-k")
    else:
        entries = index(attn, x, projected.q_lora, chunks, view, published)  # [T, k]
    n_window = int(chunks.window_offsets(attn.window)[-1])
    return torch.cat([ids, torch.where(entries >= 0, entries + n_window, -1)], dim=1)


def index(
    attn: Attention,
    x: torch.Tensor,
    q_lora: torch.Tensor,
    chunks: Chunks,
    view: StateView,
    published: Published,
) -> torch.Tensor:
    """`attn.index(...)`: this index source's top-k [T, min(k, most entries)], published."""
    positions = chunks.positions
    q, w = queries(attn.indexer, x, q_lora, positions)  # [T, Hi, Di], [T, Hi]
    n_visible = visible_counts(positions, attn.ratio)  # [T]
    counts, first = chunks.entry_counts(attn.ratio), chunks.entry_offsets(attn.ratio)[:-1]
    width = min(attn.index_topk, int(counts.max()))
    size = attn.candidate_block_size
    publish = Candidates(size, attn.candidate_topk_blocks) if attn.publishes_candidates else None
    allowed = None
    if attn.consumes_candidates:
        if published.candidates is None:
            raise Ds41Error(f"attention layer {attn.layer}: the candidate source has not run yet")
        allowed = published.candidates
    picked = torch.full((q.shape[0], width), -1, dtype=torch.int64)
    kept = None if publish is None else torch.full((q.shape[0], publish.keep), -1, dtype=torch.int64)
    for requests, rows in chunks.row_blocks(attn.row_block):  # [B', tb]
        real, at = rows >= 0, rows.clamp(min=0)
        score = attn._scorer(q[at], w[at], view, first[requests], counts[requests])
        per_column = max(rows.numel() * attn.indexer.n_heads, rows.shape[0] * attn.indexer.head_dim)
        columns = max(size, attn.score_block // per_column // size * size)
        restrict = None if allowed is None else (allowed[at].flatten(0, 1), size)
        ids, blocks = select_rows(
            score, n_visible[at].masked_fill(~real, 0).flatten(), attn.index_topk, width, columns,
            publish, restrict,
        )  # fmt: skip
        ids = ids.view(*rows.shape, width)
        if rows.shape[0] == 1 and bool(real.all()):  # one request, no padding: no masks
            picked[rows[0]] = torch.where(ids[0] >= 0, ids[0] + first[requests[0]], -1)
            if kept is not None:
                kept[rows[0]] = blocks
            continue
        picked[rows[real]] = torch.where(ids >= 0, ids + first[requests, None, None], -1)[real]
        if kept is not None:
            kept[rows[real]] = blocks.view(*rows.shape, -1)[real]
    if kept is not None:
        published.candidates = kept
    published.selection[attn.layer] = picked
    return picked


def attend(
    attn: Attention, projected: Projected, chunks: Chunks, view: StateView, ids: torch.Tensor
) -> torch.Tensor:
    """`attn.attend(projected, chunks, view, ids)`: the pool is the window rows, then the entries
    any token picked (decoded once), in entry order."""
    n_window = int(chunks.window_offsets(attn.window)[-1])
    pool = view.window()  # [n_window, Dh]
    top = int(ids.max()) + 1 if ids.numel() else 0
    if top > n_window:
        present = torch.zeros(top - n_window, dtype=torch.bool)
        entries = ids - n_window
        present[entries[entries >= 0]] = True
        wanted = present.nonzero().flatten()
        pool = torch.cat([pool, view.rows(wanted).to(pool.dtype)])  # [n_window + U, Dh]
        rank = torch.cat([torch.arange(n_window), n_window + present.cumsum(0) - 1])
        ids = torch.where(ids >= 0, rank[ids.clamp(min=0)], -1)
    o = attention(projected.q, pool, ids, attn.attn_sink, attn.softmax_scale)  # [T, H, Dh]
    return project_out(attn, o, chunks.positions)


def attention(
    q: torch.Tensor, pool: torch.Tensor, ids: torch.Tensor, sink: torch.Tensor, scale: float
) -> torch.Tensor:
    """`attention.sparse_attention(q, pool, ids, sink, scale)`, block by block of query rows:
    a block whose tokens share their rows attends the union of them (one masked GEMM)."""
    t, k = ids.shape
    if t < DENSE_ROWS // 4:
        return sparse_attention(q, pool, ids, sink, scale)
    out = torch.empty_like(q)
    for t0 in range(0, t, DENSE_ROWS):
        block = ids[t0 : t0 + DENSE_ROWS]
        present = torch.zeros(pool.shape[0] + 1, dtype=torch.bool)
        present[block.flatten()] = True  # -1 marks the extra last row
        rows = present[:-1].nonzero().flatten()
        if rows.numel() * 4 > block.shape[0] * k:  # few shared rows: gathering is cheaper
            out[t0 : t0 + DENSE_ROWS] = sparse_attention(q[t0 : t0 + DENSE_ROWS], pool, block, sink, scale)
            continue
        out[t0 : t0 + DENSE_ROWS] = _union_attention(
            q[t0 : t0 + DENSE_ROWS], pool[rows], rows, block, sink, scale
        )
    return out


def _union_attention(
    q: torch.Tensor, kv: torch.Tensor, rows: torch.Tensor, ids: torch.Tensor, sink: torch.Tensor, scale: float
) -> torch.Tensor:
    """q [T, H, Dh] over the union `kv` [U, Dh] (pool rows `rows`), each token its own `ids`
    [T, K] (-1 = none) only: softmax with the sink over the allowed columns, -> [T, H, Dh]."""
    t, h, _ = q.shape
    u = rows.numel()
    rank = torch.full((int(rows.max()) + 2,), u, dtype=torch.int64)  # -1 (the last) -> column u
    rank[rows] = torch.arange(u)
    allowed = torch.zeros(t, u + 1, dtype=torch.bool).scatter_(1, rank[ids], True)[:, :u]
    kv = upcast(kv)
    s = (upcast(q).reshape(t * h, -1) @ kv.T).view(t, h, u) * scale  # [T, H, U]
    s = s.masked_fill(~allowed[:, None, :], float("-inf"))
    sink_logit = upcast(sink).to(s.dtype).view(1, -1, 1).expand(t, -1, 1)
    p = torch.softmax(torch.cat([s, sink_logit], dim=-1), dim=-1)[..., :-1]  # [T, H, U]
    return (p.reshape(t * h, u) @ kv).view(t, h, -1).to(q.dtype)


def project_out(attn: Attention, o: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """`attn.project_out(o, positions)`: undo the query RoPE, then the grouped low-rank output."""
    o = rotate(attn.rope, o, positions, inverse=True)  # [T, H, Dh]
    o = o.flatten(1).unflatten(-1, (attn.groups, -1)).transpose(0, 1)  # [G, T, H*Dh/G]
    wo_a = attn.wo_a.weight.unflatten(0, (attn.groups, -1))  # [G, o_lora_rank, H*Dh/G]
    u = torch.bmm(o, wo_a.transpose(1, 2))  # [G, T, o_lora_rank]
    return F.linear(u.transpose(0, 1).flatten(1), attn.wo_b.weight)
