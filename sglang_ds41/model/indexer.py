"""Lightning indexer and the two-level top-k selection (MODEL.md §4.5).

Scores are `score(t, g) = sum_h w_t[h] * relu(q_t,h . kappa_g)` over the compressed entries g of
the layer's KV source. Entry g is visible to the query at position t iff
`g < n_t = floor((t + 1) / ratio)`; invisible entries score -inf and are never selected, so
the selection of a token depends on its prefix only. Selections are index lists `[T, k]` into
the KV source's compressed cache, -1 marking "no entry".
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from sglang_ds41.config import TextConfig
from sglang_ds41.formats.kv_quant import fake_quant_index_fp4

from .norm import RMSNorm, upcast
from .rope import RotaryEmbedding


class Indexer(nn.Module):
    """Index-source queries; the KV source's indexer also owns the key path (`wk`, `k_norm`)."""

    def __init__(self, cfg: TextConfig, rope: RotaryEmbedding, owns_keys: bool):
        super().__init__()
        self.n_heads, self.head_dim = cfg.index_n_heads, cfg.index_head_dim
        self.rope = rope
        self.wq_b = nn.Linear(cfg.q_lora_rank, self.n_heads * self.head_dim, bias=False)
        self.weights_proj = nn.Linear(cfg.hidden_size, self.n_heads, bias=False)
        if owns_keys:
            self.wk = nn.Linear(cfg.head_dim, self.head_dim, bias=False)
            self.k_norm = RMSNorm(self.head_dim, cfg.rms_norm_eps)

    def keys(self, latents: torch.Tensor, entry_positions: torch.Tensor) -> torch.Tensor:
        """Pre-RoPE latents [G, head_dim] -> index keys kappa [G, index_head_dim]."""
        return fake_quant_index_fp4(self.rope(self.k_norm(self.wk(latents)), entry_positions))

    def scores(
        self, x: torch.Tensor, q_lora: torch.Tensor, positions: torch.Tensor, keys: torch.Tensor
    ) -> torch.Tensor:
        """x [T, D], q_lora [T, q_lora_rank], keys [N, index_head_dim] -> scores [T, N], unmasked.

        The definition, all entries at once; the runtimes score bounded blocks of entries with
        the same two steps (`queries`, `weigh`; see `selection.py`)."""
        q, w = self.queries(x, q_lora, positions)
        return self.weigh(q[None], w[None], keys[None])[0]

    def queries(
        self, x: torch.Tensor, q_lora: torch.Tensor, positions: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """x [T, D], q_lora [T, q_lora_rank] -> (FP4 queries q^I [T, Hi, Di], head weights w [T, Hi])."""
        q = self.wq_b(q_lora).unflatten(-1, (self.n_heads, self.head_dim))  # [T, Hi, Di]
        q = fake_quant_index_fp4(self.rope(q, positions))
        w = upcast(self.weights_proj(x)) * (self.head_dim**-0.5 * self.n_heads**-0.5)  # [T, Hi]
        return q, w

    @staticmethod
    def weigh(q: torch.Tensor, w: torch.Tensor, keys: torch.Tensor) -> torch.Tensor:
        """score = sum_h w[h] * relu(q_h . key): q [B, T, Hi, Di], w [B, T, Hi], keys [B, N, Di]
        (each of B groups of queries against its own keys) -> [B, T, N], in fp32."""
        logits = F.relu(torch.einsum("bthd,bnd->bthn", upcast(q), upcast(keys)))  # [B, T, Hi, N]
        return torch.einsum("bth,bthn->btn", w, logits)


def visible_counts(positions: torch.Tensor, ratio: int) -> torch.Tensor:
    """n_t = floor((t + 1) / ratio): how many compressed entries the query at t may see."""
    return torch.div(positions + 1, ratio, rounding_mode="floor")


def mask_invisible(scores: torch.Tensor, n_visible: torch.Tensor) -> torch.Tensor:
    """scores [T, N] with entries g >= n_t set to -inf."""
    entry = torch.arange(scores.shape[1], device=scores.device)
    return scores.masked_fill(entry[None, :] >= n_visible[:, None], float("-inf"))


def candidate_blocks(
    scores: torch.Tensor, n_visible: torch.Tensor, block_size: int, n_blocks: int
) -> torch.Tensor:
    """The candidate source's published blocks: masked scores [T, N] -> bool [T, ceil(N/bs)].

    A block scores the max of its entries; the block holding the newest visible entry is
    forced in; at most `n_blocks` blocks with a finite (or forced) score are kept."""
    t, n = scores.shape
    total = -(-n // block_size)
    if total == 0:  # no entry completed yet (ratio 2, first token)
        return torch.zeros(t, 0, dtype=torch.bool, device=scores.device)
    padded = F.pad(scores, (0, total * block_size - n), value=float("-inf"))
    block_scores = padded.view(t, total, block_size).amax(dim=-1)  # [T, total]
    newest = torch.div(n_visible - 1, block_size, rounding_mode="floor").clamp(min=0)
    forced = torch.zeros_like(block_scores, dtype=torch.bool).scatter(1, newest[:, None], True)
    block_scores = block_scores.masked_fill(forced & (n_visible > 0)[:, None], float("inf"))
    best, picked = stable_topk(block_scores, n_blocks)
    keep = torch.zeros_like(block_scores, dtype=torch.bool)
    return keep.scatter(1, picked, best > float("-inf"))


def restrict_to_blocks(scores: torch.Tensor, blocks: torch.Tensor, block_size: int) -> torch.Tensor:
    """scores [T, N] with entries outside the kept blocks [T, ceil(N/bs)] set to -inf."""
    allowed = blocks.repeat_interleave(block_size, dim=1)[:, : scores.shape[1]]
    return scores.masked_fill(~allowed, float("-inf"))


def stable_topk(x: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The min(k, N) largest of x [T, N] per row, ties going to the lower index.

    The spec leaves ties open (§12.5), but relu and FP4 keys make exact ties common (every
    entry whose relu terms are all zero scores exactly 0). A fixed rule keeps the selection a
    function of the scores alone, so a chunked forward picks what the one-shot forward picks."""
    values, ids = x.sort(dim=-1, descending=True, stable=True)
    return values[:, :k], ids[:, :k]


def select_topk(scores: torch.Tensor, k: int) -> torch.Tensor:
    """masked scores [T, N] -> entry ids [T, min(k, N)] of the largest finite scores, -1 where
    fewer than k are finite (an -inf pick must never leak an invisible entry)."""
    values, ids = stable_topk(scores, k)
    return ids.masked_fill(values == float("-inf"), -1)
