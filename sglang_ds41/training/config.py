"""The trained tiny model's config: today's tiny layout (`checkpoint.tiny`), sized to learn.

Same eight layer roles as the random tiny checkpoint (window, window + Engram, ratio-2 Full +
Engram and its Reuse, ratio-1 Full + candidate source, Reuse, Reindex, Reuse), the real
vocabulary and tokenizer, three DSpark stages and a one-block ViT (validated, not trained).
What changes is what a model needs to *do* something (docs/TRAINING.md):

* width 128 with 4 heads of 64 and 8 routed experts of width 128 (plus the shared one);
* a 128-token sliding window (the release's) and a top-k of 1024 entries (the release has
  512 of its far longer contexts): up to 1024 tokens every ratio-1 layer sees every earlier
  token, so what was learnt densely is what serving computes; beyond it the trained indexer
  chooses;
* Engram tables of ~96k rows each (primes from 16,001), so n-grams rarely share a row;
* 32k positions (YaRN from 2k, so the ramp is active like the release's).
"""

from __future__ import annotations

import copy
from typing import Any

from sglang_ds41.checkpoint.tiny import tiny_config

TRAINED_TEXT: dict[str, Any] = {
    "hidden_size": 128,
    "num_attention_heads": 4,
    "head_dim": 64,
    "qk_rope_head_dim": 16,
    "q_lora_rank": 64,
    "o_lora_rank": 64,
    "o_groups": 2,
    "moe_intermediate_size": 128,
    "sliding_window": 128,
    "index_n_heads": 2,
    "index_head_dim": 32,
    "index_topk": 1024,
    "candidate_block_size": 8,
    "candidate_topk_blocks": 128,
    "max_position_embeddings": 32768,
    "rope_scaling": {"rope_type": "yarn", "factor": 16, "beta_fast": 32, "beta_slow": 1,
                     "original_max_position_embeddings": 2048},
    "engram_vocab_size": 16001,
}  # fmt: skip


def trained_config(
    variant: str = "base", engram: str = "fp8", text: dict[str, Any] | None = None
) -> dict[str, Any]:
    """The nested `config.json` of the trained tiny model (a fresh dict); `text` overrides
    `TRAINED_TEXT` (Engram row counts follow from the layout)."""
    return tiny_config(variant, engram, {**copy.deepcopy(TRAINED_TEXT), **(text or {})})
