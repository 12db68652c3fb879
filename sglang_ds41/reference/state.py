"""One request's state between forward calls of the reference model (MODEL.md §4.6, §5.6).

A request is fed as any sequence of chunks (one prefill, prefill chunks with arbitrary
boundaries, decode steps of one token); the state after each chunk is all the next chunk needs,
and feeding a sequence in chunks gives the logits of feeding it at once. What it holds:

* `attention[L]`: layer L's `AttentionState` (window KV of the last `sliding_window` tokens; on
  KV-source layers also the compressed KV, index keys and a ratio-2 pending token);
* `engram_history [1, max_ngram_size - 1]`: the last compressed token ids (oldest first,
  `engram.hashing.BLOCKED` for DEAD tokens and positions before the start);
* `position`: how many tokens the request has seen, i.e. the position of the next token.

The mHC `pre` needs no carry: it is lagged by one *site* within a token, never across tokens.
Top-k selections and candidate blocks are recomputed every forward (`model.attention.Published`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from sglang_ds41.config import TextConfig
from sglang_ds41.engram.hashing import EngramHasher
from sglang_ds41.model.attention import AttentionState


@dataclass
class RequestState:
    attention: list[AttentionState]
    engram_history: torch.Tensor  # [1, max_ngram_size - 1] int32 compressed ids
    position: int = 0

    @classmethod
    def new(
        cls, cfg: TextConfig, hasher: EngramHasher, dtype: torch.dtype, device: torch.device | None = None
    ) -> RequestState:
        """The state of a request before its first token."""
        attention = [
            AttentionState.empty(cfg, layer, dtype, device) for layer in range(cfg.num_hidden_layers)
        ]
        return cls(attention, hasher.empty_history(1), 0)
