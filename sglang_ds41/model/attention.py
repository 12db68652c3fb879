"""Attention of one layer: query, window KV, optional compressed KV + top-k, sink, grouped
output (MODEL.md §4.2–4.6), as three phases with tensors between them.

    project  x -> q, window KV, new compressed entries + index keys, pending     (§4.2, §4.4, §4.5)
    (commit) the runtime stores what project made
    select   -> ids [T, W + k]: each token's window rows and top-k entries     (§4.3, §4.5)
    attend   -> sparse attention over those rows, then the output projection   (§4.3)

The phases run a batch of requests at once (`batch.Chunks`: varlen rows) and address a layer's
state as rows of one logical pool per forward (window rows, then compressed entries, request
after request; see `batch.py`). After commit they read state only through a `StateView`:
`window()` (the batch's window rows, decoded), `index_keys(ids)` and `rows(ids)` (compressed
entries, decoding only the rows asked for). The reference implements it over its tensors
(`TensorView`), the SGLang backend over its packed pool bytes (`backend.kv_state`).

`Attention.forward` is the reference runtime: one request, state explicit as tensors. It takes
the layer's `AttentionState` from before the call and returns the state after it, and is the
composition of the phases with the tensor commit (`AttentionState.after`). What a layer
borrows from earlier layers of the *same* forward (a KV source's cache, an index source's
top-k, the candidate blocks) travels in `Published`, per-forward scratch that the layers fill in
order and nobody caches.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from typing import Protocol

import torch
from torch import nn

from sglang_ds41.config import TextConfig
from sglang_ds41.errors import Ds41Error
from sglang_ds41.formats.kv_quant import fake_quant_latent_fp4, fake_quant_window_fp8

from .batch import Chunks
from .compressor import Compressor
from .indexer import Indexer, visible_counts
from .norm import RMSNorm, upcast
from .roles import LayerRole, consumes_candidates, index_source, kv_source, layer_role
from .rope import RotaryEmbedding
from .selection import Candidates, every_entry, picks_every_entry, scan_rows

# Bounds of one indexer block: about ROW_BLOCK query rows; its scores [rows, heads, entries] and
# keys [requests, entries, index_head_dim] within SCORE_BLOCK floats each (16 MiB in fp32). The
# entries per block are what fits, a multiple of the candidate block.
ROW_BLOCK = 512
SCORE_BLOCK = 1 << 22

# An index source's query path: (indexer, x [T, D], q_lora [T, r], positions [T]) -> (q^I, w).
Queries = Callable[[Indexer, torch.Tensor, torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]]
# An index source's pick: (x [T, D], q_lora [T, r], chunks, view, published) -> entry rows [T, k].
Index = Callable[[torch.Tensor, torch.Tensor, Chunks, "StateView", "Published"], torch.Tensor]


@dataclass
class CompressedKV:
    """A KV source's global state for one request; entry g covers positions [g*ratio, (g+1)*ratio)."""

    kv: torch.Tensor  # [N, head_dim]: rope(latent, g*ratio), FP4 fake-quantised (attention K=V)
    index_keys: torch.Tensor  # [N, index_head_dim]: FP4 fake-quantised indexer keys
    pending: torch.Tensor | None = None  # [2, head_dim] (a, z) of an unpaired even token (ratio 2)


@dataclass
class NewEntries:
    """The compressed entries a KV source's forward completes, request after request (§4.4)."""

    rotated: torch.Tensor  # [G, head_dim]: rope(latent, entry position), the FP4 quantiser's input
    kv: torch.Tensor  # [G, head_dim]: fp4(rotated), what attention reads
    index_keys: torch.Tensor  # [G, index_head_dim]
    pending: torch.Tensor | None  # [B, 2, head_dim] fp32 (a, z) of requests ending unpaired (ratio 2)
    # The stored bytes of `kv` and `index_keys` (`backend.kv_codec`), when the quantisers that
    # made them also packed them (`fast.quant`); None: the store encodes them itself.
    kv_bytes: torch.Tensor | None = None
    key_bytes: torch.Tensor | None = None


@dataclass
class Projected:
    """What `Attention.project` makes of a layer's input, for the later phases and the store."""

    q_lora: torch.Tensor  # [T, q_lora_rank]: the indexer reuses it
    q: torch.Tensor  # [T, H, head_dim], post-RoPE
    window_kv: torch.Tensor  # [T, head_dim]: post-RoPE, FP8 fake-quantised (§4.2)
    entries: NewEntries | None = None  # FULL layers
    window_bytes: torch.Tensor | None = None  # window_kv's stored bytes, as NewEntries.kv_bytes


@dataclass
class AttentionState:
    """One layer's persistent per-request state (§4.6)."""

    window: torch.Tensor  # [n, head_dim]: window KV of the n (<= sliding_window) tokens before the call
    compressed: CompressedKV | None = None  # FULL layers only

    @classmethod
    def empty(cls, cfg: TextConfig, layer: int, dtype: torch.dtype, device=None) -> AttentionState:
        def rows(width: int) -> torch.Tensor:
            return torch.zeros(0, width, dtype=dtype, device=device)

        compressed = None
        if layer_role(cfg, layer) is LayerRole.FULL:
            compressed = CompressedKV(rows(cfg.head_dim), rows(cfg.index_head_dim))
        return cls(rows(cfg.head_dim), compressed)

    def after(self, projected: Projected) -> AttentionState:
        """The reference's commit (one request): this state with the chunk's window KV and
        completed entries appended (the window untrimmed) and the new pending token."""
        window = torch.cat([self.window.to(projected.window_kv.dtype), projected.window_kv])
        new, prev = projected.entries, self.compressed
        if new is None or prev is None:
            return AttentionState(window, prev)
        pending = None if new.pending is None else new.pending[0]
        kv = torch.cat([prev.kv.to(new.kv.dtype), new.kv])
        keys = torch.cat([prev.index_keys.to(new.index_keys.dtype), new.index_keys])
        return AttentionState(window, CompressedKV(kv, keys, pending))


@dataclass
class Published:
    """What earlier layers of this forward hand to later ones; rebuilt every forward."""

    # the reference's KV sources' caches after this forward (the backend's borrowers read the pool)
    compressed: dict[int, CompressedKV] = field(default_factory=dict)
    selection: dict[int, torch.Tensor] = field(default_factory=dict)  # index source -> [T, k] entry rows
    candidates: torch.Tensor | None = None  # [T, keep] block ids kept by the candidate source, -1 = none


class StateView(Protocol):
    """A layer's state for the requests of a forward, once this forward's values are committed,
    as rows of the logical pool (`batch.py`): entry rows count from the first entry."""

    def window(self) -> torch.Tensor:
        """[W, head_dim]: every request's window rows, request after request."""
        ...

    def index_keys(self, ids: torch.Tensor) -> torch.Tensor:
        """Entry rows [n] -> their index keys [n, index_head_dim] (the KV source's)."""
        ...

    def rows(self, ids: torch.Tensor) -> torch.Tensor:
        """Entry rows [n] -> their attention K=V [n, head_dim], decoding only those."""
        ...


class TensorView:
    """`StateView` over tensors: the window rows and the KV source's cache, concatenated over
    the requests (the reference has one)."""

    def __init__(self, window: torch.Tensor, compressed: CompressedKV | None = None):
        self._window, self._compressed = window, compressed

    def window(self) -> torch.Tensor:
        return self._window

    def index_keys(self, ids: torch.Tensor) -> torch.Tensor:
        return self._compressed.index_keys[ids]

    def rows(self, ids: torch.Tensor) -> torch.Tensor:
        return self._compressed.kv[ids]


def window_ids(chunks: Chunks, window: int) -> torch.Tensor:
    """[T, window]: the window rows of the pool each new token attends, oldest first and itself
    last (the window-1 positions before it); -1 = before position 0. The same for every layer
    of a forward: computed once per chunks."""
    return chunks.memo("window_ids", window, lambda: _window_ids(chunks, window))


def _window_ids(chunks: Chunks, window: int) -> torch.Tensor:
    request, positions = chunks.request, chunks.positions
    own = chunks.window_offsets(window)[request] + positions - chunks.window_starts(window)[request]
    back = torch.arange(window - 1, -1, -1)
    return (own[:, None] - back).masked_fill(positions[:, None] - back < 0, -1)


def sparse_attention(
    q: torch.Tensor, pool: torch.Tensor, ids: torch.Tensor, sink: torch.Tensor, scale: float
) -> torch.Tensor:
    """Shared-KV (K = V) attention over gathered rows, with a per-head sink logit (§4.3).

    q [T, H, Dh], pool [N, Dh], ids [T, K] rows of pool (-1 = none), sink [H] -> o [T, H, Dh].
    The sink joins the softmax denominator only: o = sum_j e^s_j v_j / (sum_j e^s_j + e^sink)."""
    t, k = ids.shape
    kv = upcast(pool).index_select(0, ids.clamp(min=0).flatten()).view(t, k, -1)  # [T, K, Dh]
    s = torch.bmm(upcast(q), kv.transpose(1, 2)).mul_(scale)  # [T, H, K]
    missing = ids < 0
    if bool(missing.any()):  # a decode step past the window start has none: skip the mask
        s.masked_fill_(missing[:, None, :], float("-inf"))
    sink_logit = upcast(sink).to(s.dtype).view(1, -1, 1).expand(t, -1, 1)
    p = torch.softmax(torch.cat([s, sink_logit], dim=-1), dim=-1)[..., :-1]  # [T, H, K]
    return torch.bmm(p, kv).to(q.dtype)


class Attention(nn.Module):
    """Parameter names follow the checkpoint's `layers.L.attn.*`."""

    def __init__(self, cfg: TextConfig, layer: int):
        super().__init__()
        self.layer, self.role = layer, layer_role(cfg, layer)
        self.ratio = cfg.compress_ratios[layer]
        self.n_heads, self.head_dim, self.groups = cfg.num_attention_heads, cfg.head_dim, cfg.o_groups
        self.window, self.index_topk = cfg.sliding_window, cfg.index_topk
        self.softmax_scale = cfg.head_dim**-0.5
        self.rope = RotaryEmbedding.for_layer(cfg, self.ratio)
        d, eps = cfg.hidden_size, cfg.rms_norm_eps
        self.wq_a = nn.Linear(d, cfg.q_lora_rank, bias=False)
        self.q_norm = RMSNorm(cfg.q_lora_rank, eps)
        self.wq_b = nn.Linear(cfg.q_lora_rank, self.n_heads * self.head_dim, bias=False)
        self.wkv = nn.Linear(d, self.head_dim, bias=False)
        self.kv_norm = RMSNorm(self.head_dim, eps)
        group_width = self.n_heads * self.head_dim // self.groups
        self.wo_a = nn.Linear(group_width, self.groups * cfg.o_lora_rank, bias=False)
        self.wo_b = nn.Linear(self.groups * cfg.o_lora_rank, d, bias=False)
        self.attn_sink = nn.Parameter(torch.zeros(self.n_heads, dtype=torch.float32))
        if self.role is LayerRole.FULL:
            self.compressor = Compressor(d, self.head_dim, self.ratio, eps)
        if self.role in (LayerRole.FULL, LayerRole.REINDEX):
            self.indexer = Indexer(cfg, self.rope, owns_keys=self.role is LayerRole.FULL)
        if self.role is not LayerRole.WINDOW:
            self.kv_source, self.index_source = kv_source(cfg, layer), index_source(cfg, layer)
            self.publishes_candidates = layer == cfg.candidate_source_layer_id
            self.consumes_candidates = consumes_candidates(cfg, layer)
            self.candidate_block_size = cfg.candidate_block_size
            self.candidate_topk_blocks = cfg.candidate_topk_blocks
            self.row_block, self.score_block = ROW_BLOCK, SCORE_BLOCK  # the indexer scan's bounds

    # ---- the reference runtime: one request, state as tensors ------------------------------

    def forward(
        self, x: torch.Tensor, positions: torch.Tensor, state: AttentionState, published: Published
    ) -> tuple[torch.Tensor, AttentionState]:
        """x [T, D] (normed collapse) at contiguous positions [T] of one request -> (y [T, D],
        the state after these tokens). Fills `published` for later layers of this forward."""
        chunks = Chunks.of([int(positions[0])], [x.shape[0]])
        pending = self._check(state, chunks)
        projected = self.project(x, chunks, pending)
        after = state.after(projected)
        view = self._tensor_view(after, chunks, published)
        ids = self.select(x, projected, chunks, view, published)
        y = self.attend(projected, chunks, view, ids)
        return y, AttentionState(after.window[-self.window :], after.compressed)

    def _check(self, state: AttentionState, chunks: Chunks) -> torch.Tensor | None:
        """The state fits a chunk starting at chunks.starts[0]; returns its pending row [1, 2, Dh]."""
        start = int(chunks.starts[0])
        if state.window.shape[0] < min(start, self.window - 1):
            raise Ds41Error(
                f"attention layer {self.layer}: the window state holds {state.window.shape[0]} tokens, "
                f"but a chunk starting at position {start} needs the previous {min(start, self.window - 1)}"
            )
        prev = state.compressed
        if self.role is not LayerRole.FULL or prev is None:
            return None
        expected = start // self.ratio
        if prev.kv.shape[0] != expected:
            raise Ds41Error(
                f"attention layer {self.layer}: compressed state holds {prev.kv.shape[0]} entries, "
                f"expected {expected} before position {start} (ratio {self.ratio})"
            )
        if prev.pending is not None and start % 2 == 0:
            raise Ds41Error(f"compressor: got a pending token but the chunk starts at even position {start}")
        return None if prev.pending is None else prev.pending[None]

    def _tensor_view(self, after: AttentionState, chunks: Chunks, published: Published) -> TensorView:
        """The pool of this request: its window rows, the KV source's cache after this forward."""
        n_window = int(chunks.ends[0] - chunks.window_starts(self.window)[0])
        window = after.window[after.window.shape[0] - n_window :]
        if self.role is LayerRole.WINDOW:
            return TensorView(window)
        if self.role is LayerRole.FULL:
            published.compressed[self.layer] = after.compressed
        return TensorView(window, self._borrow(published.compressed, self.kv_source, "compressed KV"))

    # ---- the phases (a batch of requests) --------------------------------------------------

    def project(self, x: torch.Tensor, chunks: Chunks, pending: torch.Tensor | None = None) -> Projected:
        """x [T, D] -> q, window KV and (KV source) the entries the chunks complete (§4.2, §4.4):
        index keys from the pre-RoPE latents, attention entries = fp4(rope(latent, entry
        position)). `pending` [B, 2, Dh]: each request's unpaired even token (ratio 2)."""
        positions = chunks.positions.to(x.device)
        q_lora = self.q_norm(self.wq_a(x))  # [T, q_lora_rank]
        q = self.rope(self.wq_b(q_lora).unflatten(-1, (self.n_heads, self.head_dim)), positions)  # [T, H, Dh]
        window_kv = fake_quant_window_fp8(self.rope(self.kv_norm(self.wkv(x)), positions))  # [T, Dh]
        entries = None
        if self.role is LayerRole.FULL:
            latents, entry_positions, new_pending = self.compressor.compress(x, chunks, pending)  # [G, Dh]
            keys = self.indexer.keys(latents, entry_positions)  # [G, Di]
            rotated = self.rope(latents, entry_positions)
            entries = NewEntries(rotated, fake_quant_latent_fp4(rotated), keys, new_pending)
        return Projected(q_lora, q, window_kv, entries)

    def select(
        self,
        x: torch.Tensor,
        projected: Projected,
        chunks: Chunks,
        view: StateView,
        published: Published,
        index: Index | None = None,
    ) -> torch.Tensor:
        """Rows of the pool each token attends [T, W + k] (-1 = none): its window, then the
        entries its index source picked (§4.3, §4.5). Fills `published` for later layers.
        `index`: how an index source picks (default `Attention.index`; the backend passes its
        fast path, `fast.attention.index`)."""
        ids = window_ids(chunks, self.window)  # [T, W]
        if self.role is LayerRole.WINDOW:
            return ids
        if self.role is LayerRole.REUSE:
            entries = self._borrow(published.selection, self.index_source, "top-k")
        else:
            pick = self.index if index is None else index
            entries = pick(x, projected.q_lora, chunks, view, published)  # [T, k]
        n_window = int(chunks.window_offsets(self.window)[-1])
        return torch.cat([ids, torch.where(entries >= 0, entries + n_window, -1)], dim=1)

    def attend(
        self, projected: Projected, chunks: Chunks, view: StateView, ids: torch.Tensor
    ) -> torch.Tensor:
        """Sparse attention of each token over its rows [T, W + k], then the output: -> y [T, D].
        Only the entries picked are decoded."""
        n_window = int(chunks.window_offsets(self.window)[-1])
        pool = view.window()  # [n_window, Dh]: the window rows, then the picked entries
        entry = ids >= n_window
        wanted, where = torch.unique(ids[entry] - n_window, return_inverse=True)
        if wanted.numel():
            pool = torch.cat([pool, view.rows(wanted).to(pool.dtype)])  # [n_window + U, Dh]
        local = ids.clone()
        local[entry] = where + n_window
        o = sparse_attention(projected.q, pool, local, self.attn_sink, self.softmax_scale)  # [T, H, Dh]
        return self.project_out(o, chunks.positions.to(o.device))

    def index(
        self,
        x: torch.Tensor,
        q_lora: torch.Tensor,
        chunks: Chunks,
        view: StateView,
        published: Published,
        queries: Queries | None = None,
        scan: Callable = scan_rows,
    ) -> torch.Tensor:
        """This index source's top-k: entry rows [T, min(k, most entries)] (-1 = none), from
        scores of bounded blocks of entries (`selection.py`), or every visible entry unscored
        when no token sees more than k; publishes it, and the candidate blocks on the
        candidate source. `queries`, `scan`: the backend's fast paths of
        `Indexer.queries` and `scan_rows` (`fast.attention`, `fast.selection`)."""
        positions = chunks.positions.to(x.device)
        n_visible = visible_counts(positions, self.ratio)  # [T]
        counts, first = chunks.entry_counts(self.ratio), chunks.entry_offsets(self.ratio)[:-1]
        width = self.index_width(chunks)
        publish, allowed = self.candidate_rule(published)
        within = None if allowed is None else (allowed, self.candidate_block_size)  # [T, keep]
        if picks_every_entry(n_visible, self.index_topk, publish):
            picked, kept = every_entry(n_visible, first[chunks.request], width, publish, within)
            return self.publish(published, picked, kept)
        form = self.indexer.queries if queries is None else partial(queries, self.indexer)
        q, w = form(x, q_lora, positions)  # [T, Hi, Di], [T, Hi]
        picked = torch.full((q.shape[0], width), -1, dtype=torch.int64)
        kept = None if publish is None else torch.full((q.shape[0], publish.keep), -1, dtype=torch.int64)
        for requests, rows in chunks.row_blocks(self.row_block):  # [B', tb], [B', tb]
            real, at = rows >= 0, rows.clamp(min=0)
            score = self.scorer(q[at], w[at], view, first[requests], counts[requests])
            restrict = None if allowed is None else (allowed[at].flatten(0, 1), self.candidate_block_size)
            ids, blocks = scan(
                score, n_visible[at].masked_fill(~real, 0).flatten(), self.index_topk, width,
                self.column_block(rows.shape[0], rows.numel()), publish, restrict,
            )  # fmt: skip
            ids = ids.view(*rows.shape, width)
            picked[rows[real]] = torch.where(ids >= 0, ids + first[requests, None, None], -1)[real]
            if kept is not None:
                kept[rows[real]] = blocks.view(*rows.shape, -1)[real]
        return self.publish(published, picked, kept)

    def index_width(self, chunks: Chunks) -> int:
        """The columns of the index's top-k: k, or fewer while every request has fewer entries."""
        return min(self.index_topk, int(chunks.entry_counts(self.ratio).max()))

    def candidate_rule(self, published: Published) -> tuple[Candidates | None, torch.Tensor | None]:
        """(the rule of the blocks this layer publishes, the published blocks it is restricted to)."""
        publish = None
        if self.publishes_candidates:
            publish = Candidates(self.candidate_block_size, self.candidate_topk_blocks)
        if not self.consumes_candidates:
            return publish, None
        if published.candidates is None:
            raise Ds41Error(f"attention layer {self.layer}: the candidate source has not run yet")
        return publish, published.candidates

    def column_block(self, requests: int, rows: int) -> int:
        """Entries per scored block for `rows` query rows of `requests` requests: its scores
        [rows, heads, entries] and keys [requests, entries, index_head_dim] within the score
        block, a multiple of the candidate block."""
        size = self.candidate_block_size
        per_column = max(rows * self.indexer.n_heads, requests * self.indexer.head_dim)
        return max(size, self.score_block // per_column // size * size)

    def publish(self, published: Published, picked: torch.Tensor, kept: torch.Tensor | None) -> torch.Tensor:
        """Hands this index source's top-k (and kept candidate blocks) to later layers; -> picked."""
        if kept is not None:
            published.candidates = kept
        published.selection[self.layer] = picked
        return picked

    def scorer(
        self, q: torch.Tensor, w: torch.Tensor, view: StateView, first: torch.Tensor, counts: torch.Tensor
    ) -> Callable[[int, int], torch.Tensor]:
        """score(c0, c1) -> [B' * tb, c1 - c0]: the row block's queries q [B', tb, Hi, Di] (weights
        w [B', tb, Hi]) against entries c0..c1-1 of their own request (B' requests whose entry
        rows start at `first`, `counts` of them; missing entries score 0, masked later)."""

        def score(c0: int, c1: int) -> torch.Tensor:
            g = torch.arange(c0, c1)
            rows = first[:, None] + g[None, :]  # [B', c]
            if bool((counts >= c1).all()):  # every request has them all (a decode step of one)
                keys = view.index_keys(rows.flatten()).view(*rows.shape, -1)
            else:
                exists = g[None, :] < counts[:, None]
                found = view.index_keys(rows[exists])
                keys = found.new_zeros(*exists.shape, found.shape[-1])
                keys[exists] = found
            return self.indexer.weigh(q, w, keys).flatten(0, 1)

        return score

    def project_out(self, o: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """Undo the query-position RoPE, then the grouped low-rank output: [T, H, Dh] -> [T, D]."""
        o = self.rope(o, positions, inverse=True)  # [T, H, Dh]
        o = o.flatten(1).unflatten(-1, (self.groups, -1))  # [T, G, H*Dh/G]
        wo_a = self.wo_a.weight.unflatten(0, (self.groups, -1))  # [G, o_lora_rank, H*Dh/G]
        u = torch.einsum("tgi,gri->tgr", o, wo_a)  # [T, G, o_lora_rank]
        return self.wo_b(u.flatten(1))

    def _borrow(self, table: dict, source: int, what: str):
        if source not in table:
            raise Ds41Error(
                f"attention layer {self.layer}: {what} of layer {source} is missing; "
                "run the layers of a forward in order"
            )
        return table[source]
