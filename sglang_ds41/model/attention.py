"""Attention of one layer: query, window KV, optional compressed KV + top-k, sink, grouped
output (MODEL.md §4.2–4.6).

State is explicit so that both runtimes own the storage: `Attention.forward` takes the
layer's `AttentionState` from before the call and returns the state after it; what a layer
borrows from earlier layers of the *same* forward (a KV source's updated compressed cache,
an index source's top-k, the candidate blocks) travels in `Published`, per-forward scratch
that the layers fill in order and nobody caches.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import nn

from sglang_ds41.config import TextConfig
from sglang_ds41.errors import Ds41Error
from sglang_ds41.formats.kv_quant import fake_quant_latent_fp4, fake_quant_window_fp8

from .compressor import Compressor
from .indexer import (
    Indexer,
    candidate_blocks,
    mask_invisible,
    restrict_to_blocks,
    select_topk,
    visible_counts,
)
from .norm import RMSNorm, upcast
from .roles import LayerRole, consumes_candidates, index_source, kv_source, layer_role
from .rope import RotaryEmbedding


@dataclass
class CompressedKV:
    """A KV source's global state for one request; entry g covers positions [g*ratio, (g+1)*ratio)."""

    kv: torch.Tensor  # [N, head_dim]: rope(latent, g*ratio), FP4 fake-quantised (attention K=V)
    index_keys: torch.Tensor  # [N, index_head_dim]: FP4 fake-quantised indexer keys
    pending: torch.Tensor | None = None  # [2, head_dim] (a, z) of an unpaired even token (ratio 2)


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


@dataclass
class Published:
    """What earlier layers of this forward hand to later ones; rebuilt every forward."""

    compressed: dict[int, CompressedKV] = field(default_factory=dict)  # KV source -> updated cache
    selection: dict[int, torch.Tensor] = field(default_factory=dict)  # index source -> [T, k] entry ids
    candidates: torch.Tensor | None = None  # [T, n_blocks] bool, from the candidate source


def window_ids(n_prev: int, n_new: int, window: int, device=None) -> torch.Tensor:
    """Rows of `cat(previous window, new KV)` each new token attends: [T, window], -1 = none.

    New token i sits at row n_prev + i and sees itself and the window-1 rows before it."""
    own = n_prev + torch.arange(n_new, device=device)
    ids = own[:, None] - torch.arange(window - 1, -1, -1, device=device)  # oldest .. itself
    return ids.masked_fill(ids < 0, -1)


def sparse_attention(
    q: torch.Tensor, pool: torch.Tensor, ids: torch.Tensor, sink: torch.Tensor, scale: float
) -> torch.Tensor:
    """Shared-KV (K = V) attention over gathered rows, with a per-head sink logit (§4.3).

    q [T, H, Dh], pool [N, Dh], ids [T, K] rows of pool (-1 = none), sink [H] -> o [T, H, Dh].
    The sink joins the softmax denominator only: o = sum_j e^s_j v_j / (sum_j e^s_j + e^sink)."""
    kv = upcast(pool)[ids.clamp(min=0)]  # [T, K, Dh]
    s = torch.einsum("thd,tkd->thk", upcast(q), kv) * scale  # [T, H, K]
    s = s.masked_fill((ids < 0)[:, None, :], float("-inf"))
    sink_logit = upcast(sink).to(s.dtype).view(1, -1, 1).expand(s.shape[0], -1, 1)
    p = torch.softmax(torch.cat([s, sink_logit], dim=-1), dim=-1)[..., :-1]  # [T, H, K]
    return torch.einsum("thk,tkd->thd", p, kv).to(q.dtype)


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

    def forward(
        self, x: torch.Tensor, positions: torch.Tensor, state: AttentionState, published: Published
    ) -> tuple[torch.Tensor, AttentionState]:
        """x [T, D] (normed collapse) at contiguous positions [T] of one request -> (y [T, D],
        the state after these tokens). Fills `published` for later layers of this forward."""
        start = int(positions[0])
        if state.window.shape[0] < min(start, self.window - 1):
            raise Ds41Error(
                f"attention layer {self.layer}: the window state holds {state.window.shape[0]} tokens, "
                f"but a chunk starting at position {start} needs the previous {min(start, self.window - 1)}"
            )
        q_lora = self.q_norm(self.wq_a(x))  # [T, q_lora_rank]
        q = self.rope(self.wq_b(q_lora).unflatten(-1, (self.n_heads, self.head_dim)), positions)  # [T, H, Dh]
        kv = self.window_kv(x, positions)  # [T, Dh]
        window = torch.cat([state.window.to(kv.dtype), kv])  # [n + T, Dh]
        pool, ids = window, window_ids(state.window.shape[0], x.shape[0], self.window, x.device)
        compressed = None
        if self.role is not LayerRole.WINDOW:
            compressed, selection = self.select(x, q_lora, positions, state, published)  # [T, k]
            ids = torch.cat([ids, torch.where(selection >= 0, selection + pool.shape[0], -1)], dim=1)
            pool = torch.cat([pool, compressed.kv.to(pool.dtype)])
        o = sparse_attention(q, pool, ids, self.attn_sink, self.softmax_scale)  # [T, H, Dh]
        own = compressed if self.role is LayerRole.FULL else None
        return self.project_out(o, positions), AttentionState(window[-self.window :], own)

    def window_kv(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """Each token's window KV [T, Dh] (post-RoPE, FP8 fake-quantised): its own method so a
        runtime that stores every token's KV (not only the last window) can capture it."""
        return fake_quant_window_fp8(self.rope(self.kv_norm(self.wkv(x)), positions))

    def select(
        self,
        x: torch.Tensor,
        q_lora: torch.Tensor,
        positions: torch.Tensor,
        state: AttentionState,
        published: Published,
    ) -> tuple[CompressedKV, torch.Tensor]:
        """The compressed cache this layer attends and the entries each token picks from it."""
        if self.role is LayerRole.FULL:
            compressed = self.compress(x, positions, state.compressed)
            published.compressed[self.layer] = compressed
        else:
            compressed = self._borrow(published.compressed, self.kv_source, "compressed KV")
        if self.role is LayerRole.REUSE:
            return compressed, self._borrow(published.selection, self.index_source, "top-k")
        n_visible = visible_counts(positions, self.ratio)  # [T]
        scores = self.indexer.scores(x, q_lora, positions, compressed.index_keys)  # [T, N]
        scores = mask_invisible(scores, n_visible)
        if self.publishes_candidates:
            published.candidates = candidate_blocks(
                scores, n_visible, self.candidate_block_size, self.candidate_topk_blocks
            )
        if self.consumes_candidates:
            if published.candidates is None:
                raise Ds41Error(f"attention layer {self.layer}: the candidate source has not run yet")
            scores = restrict_to_blocks(scores, published.candidates, self.candidate_block_size)
        selection = select_topk(scores, self.index_topk)
        published.selection[self.layer] = selection
        return compressed, selection

    def compress(self, x: torch.Tensor, positions: torch.Tensor, prev: CompressedKV) -> CompressedKV:
        """Append the entries completed by this chunk: index keys from the pre-RoPE latents,
        attention entries = fp4(rope(latent, entry position))."""
        expected = int(positions[0]) // self.ratio
        if prev.kv.shape[0] != expected:
            raise Ds41Error(
                f"attention layer {self.layer}: compressed state holds {prev.kv.shape[0]} entries, "
                f"expected {expected} before position {int(positions[0])} (ratio {self.ratio})"
            )
        latents, entry_positions, pending = self.compressor(x, positions, prev.pending)  # [G, Dh]
        keys = self.indexer.keys(latents, entry_positions)  # [G, Di]
        entries = self.quantize_entries(self.rope(latents, entry_positions))  # [G, Dh]
        return CompressedKV(
            torch.cat([prev.kv.to(entries.dtype), entries]),
            torch.cat([prev.index_keys.to(keys.dtype), keys]),
            pending,
        )

    def quantize_entries(self, rotated: torch.Tensor) -> torch.Tensor:
        """New compressed entries [G, Dh] as attended: FP4 fake-quantised. Its own method so a
        runtime that stores the FP4 codes can quantise the same input (the E4M3 scale rule is
        not idempotent for small blocks, so the output cannot be re-quantised instead)."""
        return fake_quant_latent_fp4(rotated)

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
