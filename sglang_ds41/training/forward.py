"""The reference `Transformer` run over a batch of whole sequences, with autograd (training).

The reference runtime (`reference/model.py`) feeds one request at a time under `no_grad`; the
trainer needs many sequences at once and gradients. This module drives the *same* modules
(`Block.engram` gate, `hc_attn` / `hc_ffn`, `Attention.project` and `Attention.select`, `MoE`,
the norms) over a varlen batch of sequences that all start at position 0; the mHC sites'
Sinkhorn runs as `training.sinkhorn` (the same values and gradients bit for bit, faster; its
own tests compare the two, the float64 comparisons below take the oracle), and only the last
step of attention is replaced:

* `Attention.attend` gathers each token's `W + k` rows and multiplies them out one token at a
  time (`sparse_attention`), which is exact and cheap for decode but, for a training batch,
  holds `[T, W + k, head_dim]` copies of the KV and every softmax for the backward.
* Here the rows `select` picked become a boolean mask over each sequence's own KV (its window
  rows, then its compressed entries), and the attention runs as one masked
  `scaled_dot_product_attention` per batch. The sink joins the softmax as one more key: an
  extra channel that is 1 in every query and `sink / scale` in the sink key (0 in the real
  keys, whose value row is 0), so `softmax([q.k * scale, sink])` is exactly V4.1's
  `e^s / (sum e^s + e^sink)` (MODEL.md §4.3).

The selection itself (window bands, the indexer's top-k, the candidate blocks) is the
runtime's, unchanged, computed without gradients as the index is discrete. Tests compare this
forward's logits with the reference forward's, sequence by sequence.

Engram tables train as float parameters (`EngramTables`), looked up by the row ids the
production hasher gives each token (`EngramHasher.hash_sequence`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, fields

import torch
import torch.nn.functional as F
from torch import nn

from sglang_ds41.engram.gate import EngramGate
from sglang_ds41.model import Chunks, Published, collapse, expand, first_pre
from sglang_ds41.model.attention import Attention, CompressedKV, TensorView
from sglang_ds41.model.roles import LayerRole
from sglang_ds41.reference.model import Transformer

from .quant import ROUNDING
from .sinkhorn import sinkhorn


@dataclass(frozen=True)
class Batch:
    """Sequences flattened (varlen), all starting at position 0.

    `ids [T]`, `lengths [B]`, `engram_rows [T, n_engram_layers, n_columns]` (the hasher's row
    ids of each token), `targets [T]` (the next id, -100 where no loss is taken)."""

    ids: torch.Tensor
    lengths: torch.Tensor
    engram_rows: torch.Tensor
    targets: torch.Tensor

    @property
    def chunks(self) -> Chunks:
        return Chunks(torch.zeros_like(self.lengths), self.lengths)

    def join(self, other: Batch) -> Batch:
        """This batch's sequences, then `other`'s: one step learns from both."""
        return Batch(*(torch.cat([getattr(self, f.name), getattr(other, f.name)]) for f in fields(self)))

    def by_length(self) -> Batch:
        """The same sequences, shortest first (stable): the attention runs over sequences of
        like length together (`length_groups`)."""
        order = torch.argsort(self.lengths, stable=True)
        if torch.equal(order, torch.arange(order.numel())):
            return self
        offsets = self.chunks.offsets
        rows = torch.cat([torch.arange(offsets[b], offsets[b + 1]) for b in order.tolist()])
        return Batch(
            **{f.name: getattr(self, f.name)[order if f.name == "lengths" else rows] for f in fields(self)}
        )


class EngramTables(nn.Module):
    """The Engram tables of the trained layers as float parameters `[rows, head_dim]` each.

    They start at zero: a row no training n-gram hashes to stays exactly zero (so it costs
    nothing to store), and the layer's output for such a row is its gate on a zero value. Rows
    are read as the FP8 release stores them (`quant.fp8_rows`, one scale per row), so the
    exported table is the one trained with."""

    def __init__(self, layer_ids: tuple[int, ...], rows: tuple[int, ...], head_dim: int):
        super().__init__()
        self.layer_ids = layer_ids
        self.tables = nn.ParameterList(nn.Parameter(torch.zeros(n, head_dim)) for n in rows)
        self.rounding = True  # read rows as FP8 (quantisation-aware training, `quant.py`)

    def lookup(self, index: int, row_ids: torch.Tensor) -> torch.Tensor:
        """Row ids [T, n_columns] of the index-th Engram layer -> rows [T, n_columns, head_dim]."""
        rows = F.embedding(row_ids, self.tables[index])
        return ROUNDING["engram_fp8"](rows) if self.rounding else rows


def forward_hidden(
    model: Transformer,
    tables: EngramTables,
    batch: Batch,
    embed: Callable[[torch.Tensor], torch.Tensor] | None = None,
) -> torch.Tensor:
    """The final normed hidden states [T, D] of every token of the batch (before the head);
    `embed(ids)` gives the input embeddings (default: the model's embedding module)."""
    chunks = batch.chunks
    t = batch.ids.shape[0]
    e = (model.embed if embed is None else embed)(batch.ids)  # [T, D]
    r = e[:, None, :].expand(t, model.text.hc_mult, e.shape[-1])  # [T, hc, D]
    pre = first_pre(r)
    published = Published()
    for block in model.layers:
        if block.engram is not None:
            index = tables.layer_ids.index(block.layer)
            rows = tables.lookup(index, batch.engram_rows[:, index])
            r = EngramGate.forward(block.engram, r, rows)
        coeffs = block.hc_attn(r, normalise=sinkhorn)
        y = attention(block.attn, block.attn_norm(collapse(r, pre)), chunks, published)
        r = expand(r, y, coeffs.post, coeffs.comb)
        pre = coeffs.pre
        coeffs = block.hc_ffn(r, normalise=sinkhorn)
        y = block.ffn(block.ffn_norm(collapse(r, pre)))
        r = expand(r, y, coeffs.post, coeffs.comb)
        pre = coeffs.pre
    return model.norm(collapse(r, pre))


def attention(attn: Attention, x: torch.Tensor, chunks: Chunks, published: Published) -> torch.Tensor:
    """One layer's attention over the batch: x [T, D] -> y [T, D] (see the module docstring)."""
    projected = attn.project(x, chunks)
    view = _view(attn, projected, published)
    entries = None
    if attn.role is not LayerRole.WINDOW:
        entries = published.compressed[attn.kv_source].kv
    if sees_everything(attn, chunks):
        o = torch.cat(
            [
                banded_attention(
                    attn,
                    projected.q[tokens],
                    projected.window_kv[tokens],
                    None if entries is None else entries[entry_rows],
                    group,
                )
                for group, tokens, entry_rows in length_groups(attn, chunks)
            ]
        )
    else:
        with torch.no_grad():
            ids = attn.select(x, projected, chunks, view, published)  # [T, W + k] pool rows, -1 = none
        o = masked_attention(attn, projected.q, projected.window_kv, entries, ids, chunks)
    return attn.project_out(o, chunks.positions)


def length_groups(attn: Attention, chunks: Chunks) -> list[tuple[Chunks, slice, slice]]:
    """The batch's runs of consecutive sequences with the same number of `banded_attention`
    query blocks: (their chunks, their token rows, their entry rows at the layer's ratio; a
    window layer has no entries, its entry slice is unused). Attention is per sequence, so a
    run at a time is the same attention; a sequence padded to the batch's longest costs as
    much as the longest (drills of ~100-180 tokens beside conversations of up to ~800 padded
    a step's attention to 2-4x its tokens)."""
    ratio = attn.ratio
    block = query_block(attn)
    blocks = torch.div(chunks.lengths + block - 1, block, rounding_mode="floor").tolist()
    offsets = chunks.offsets.tolist()
    entry_offsets = chunks.entry_offsets(max(ratio, 1)).tolist()
    groups, first = [], 0
    for b in range(1, len(blocks) + 1):
        if b == len(blocks) or blocks[b] != blocks[first]:
            lengths = chunks.lengths[first:b]
            groups.append(
                (
                    Chunks(torch.zeros_like(lengths), lengths),
                    slice(offsets[first], offsets[b]),
                    slice(entry_offsets[first], entry_offsets[b]),
                )
            )
            first = b
    return groups


def sees_everything(attn: Attention, chunks: Chunks) -> bool:
    """Whether every token's selection is its whole window plus every entry it may see: the
    top-k (and, for a candidate consumer, the kept blocks) holds all visible entries."""
    if attn.role is LayerRole.WINDOW:
        return True
    most = int(chunks.entry_counts(attn.ratio).max())
    blocks = attn.candidate_topk_blocks * attn.candidate_block_size
    return attn.index_topk >= most and (not attn.consumes_candidates or blocks >= most)


def _view(attn: Attention, projected, published: Published) -> TensorView:
    """The batch's pool: every token's window KV (sequences start at 0, so a request's window
    rows are all of its tokens), then the KV source's entries of every request."""
    if attn.role is LayerRole.WINDOW:
        return TensorView(projected.window_kv)
    if attn.role is LayerRole.FULL:
        new = projected.entries
        published.compressed[attn.layer] = CompressedKV(new.kv, new.index_keys)
    return TensorView(projected.window_kv, published.compressed[attn.kv_source])


def _sink_attention(attn: Attention, q: torch.Tensor, keys: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """V4.1's shared-KV attention with the sink: q [B, H, L, Dh], keys [B, N, Dh] (K = V),
    mask [.., L, N] -> o [B, H, L, Dh]. The sink is key N: the queries get one more channel
    holding `sink[h] / scale`, the sink key is 1 there and 0 elsewhere, its value row 0."""
    b, h, n_q, dh = q.shape
    scale = attn.softmax_scale
    sink = (attn.attn_sink.to(q.dtype) / scale).view(1, h, 1, 1).expand(b, h, n_q, 1)
    q_aug = torch.cat([q, sink], dim=-1)
    k_aug = F.pad(torch.cat([keys, keys.new_zeros(b, 1, dh)], dim=1), (0, 1))  # [B, N + 1, Dh + 1]
    k_aug[:, -1, -1] = 1
    v_aug = F.pad(keys, (0, 1, 0, 1))  # value rows, the sink's zero; one channel of padding
    mask = torch.cat([mask, mask.new_ones(*mask.shape[:-1], 1)], dim=-1)
    o = F.scaled_dot_product_attention(
        q_aug, k_aug[:, None], v_aug[:, None], attn_mask=mask, scale=scale, enable_gqa=True
    )
    return o[..., :dh]


# Query rows per block of `banded_attention`: a block reads the window rows of itself and the
# block before it, so the window costs 2 x block keys per query instead of the whole sequence.
BAND_BLOCK = 128


def query_block(attn: Attention) -> int:
    """Query rows per block of `banded_attention` for this layer (at least its window)."""
    return max(BAND_BLOCK, attn.window)


def banded_attention(
    attn: Attention, q: torch.Tensor, window_kv: torch.Tensor, entries: torch.Tensor | None, chunks: Chunks
) -> torch.Tensor:
    """The attention when every token sees its whole window and every entry visible to it
    (`sees_everything`): q [T, H, Dh] -> o [T, H, Dh], blocks of query rows at a time, each
    over the window rows that can reach it and the entries completed by its last row."""
    lengths, offsets = chunks.lengths, chunks.offsets
    longest = int(lengths.max())
    h, dh, window = attn.n_heads, attn.head_dim, attn.window
    block = query_block(attn)
    qp = _padded(q.flatten(1), offsets, lengths, longest).unflatten(-1, (h, dh)).transpose(1, 2)
    kv = _padded(window_kv, offsets, lengths, longest)  # [B, L, Dh]
    if entries is not None:
        counts = chunks.entry_counts(attn.ratio)
        stored = _padded(entries, chunks.entry_offsets(attn.ratio), counts, max(int(counts.max()), 1))
    outs = []
    # One split, not a slice per block: a slice's backward zero-fills the whole [B, H, L, Dh]
    # and the blocks' gradients are summed (quadratic in the blocks); the split's is one cat.
    q_blocks = qp.split(block, dim=2)
    for q0 in range(0, longest, block):
        q1 = min(q0 + block, longest)
        k0 = max(0, q0 - (window - 1))
        rows = torch.arange(q0, q1)[:, None]
        keys = kv[:, k0:q1]
        band = torch.arange(k0, q1)[None, :]
        mask = (band <= rows) & (band > rows - window)  # [q, k]: the window, itself last
        if entries is not None:
            n = min((q1 + 1 - 1) // attn.ratio, stored.shape[1])  # entries the block's last row sees
            keys = torch.cat([keys, stored[:, :n]], dim=1)
            visible = torch.arange(n)[None, :] < torch.div(rows + 1, attn.ratio, rounding_mode="floor")
            mask = torch.cat([mask, visible], dim=1)
        outs.append(_sink_attention(attn, q_blocks[q0 // block], keys, mask))
    o = torch.cat(outs, dim=2).transpose(1, 2)  # [B, L, H, Dh]
    valid = torch.arange(longest)[None, :] < lengths[:, None]
    return o[valid]


def masked_attention(
    attn: Attention,
    q: torch.Tensor,
    window_kv: torch.Tensor,
    entries: torch.Tensor | None,
    ids: torch.Tensor,
    chunks: Chunks,
) -> torch.Tensor:
    """q [T, H, Dh] over the pool rows `ids` [T, K] picked for each token -> o [T, H, Dh]:
    any selection (the indexer's top-k, candidate blocks), one mask per batch.

    Per sequence b the keys are its L_b window rows (padded to L) then its G_b entries (padded
    to G): [B, L + G]."""
    b, lengths = chunks.size, chunks.lengths
    longest = int(lengths.max())
    offsets = chunks.offsets
    request = chunks.request
    local = torch.arange(q.shape[0]) - offsets[request]  # [T] position within its sequence
    keys = _padded(window_kv, offsets, lengths, longest)  # [B, L, Dh]
    n_window = int(offsets[-1])
    columns = torch.where(ids >= 0, ids - offsets[request, None], -1)  # window rows: local column
    if entries is not None:
        counts = chunks.entry_counts(attn.ratio)
        entry_offsets = chunks.entry_offsets(attn.ratio)
        most = max(int(counts.max()), 1)
        keys = torch.cat([keys, _padded(entries, entry_offsets, counts, most)], dim=1)  # [B, L + G, Dh]
        is_entry = ids >= n_window
        columns = torch.where(is_entry, ids - n_window - entry_offsets[request, None] + longest, columns)
    mask = torch.zeros(b, longest, keys.shape[1], dtype=torch.bool)
    picked = columns >= 0
    rows = local[:, None].expand_as(columns)
    seqs = request[:, None].expand_as(columns)
    mask[seqs[picked], rows[picked], columns[picked]] = True
    h, dh = attn.n_heads, attn.head_dim
    qp = (
        _padded(q.flatten(1), offsets, lengths, longest).unflatten(-1, (h, dh)).transpose(1, 2)
    )  # [B, H, L, Dh]
    o = _sink_attention(attn, qp, keys, mask[:, None]).transpose(1, 2)  # [B, L, H, Dh]
    valid = torch.arange(longest)[None, :] < lengths[:, None]
    return o[valid]  # [T, H, Dh], sequence after sequence


def _padded(rows: torch.Tensor, offsets: torch.Tensor, counts: torch.Tensor, width: int) -> torch.Tensor:
    """Varlen rows [sum counts, C] (sequence b's from offsets[b]) -> [B, width, C], zero padded:
    one index copy (its backward one gather; a masked scatter's backward, a masked select with
    a broadcast mask, took ~10x as long)."""
    b, c = counts.numel(), rows.shape[-1]
    sequence = torch.repeat_interleave(torch.arange(b), counts)  # [N]
    place = sequence * width + torch.arange(sequence.numel()) - offsets[sequence]
    return rows.new_zeros(b * width, c).index_copy(0, place, rows).view(b, width, c)
