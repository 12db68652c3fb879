"""The slot-indexed state layout: what it costs per token of context."""

from __future__ import annotations

from pathlib import Path

from sglang_ds41.backend.kv_state import kv_bytes_per_token
from sglang_ds41.config import V41Config

FIXTURES = Path(__file__).parent.parent / "fixtures"


def test_state_bytes_per_token_of_the_layout():
    tiny = V41Config.from_file(FIXTURES / "tiny_config.json").text
    # window: 8 layers x (64 FP8 + 2 scales); an entry: latent 32 + 4, index key 16 + 1;
    # sources: layer 2 (ratio 2) half an entry per token, layer 4 (ratio 1) one
    assert kv_bytes_per_token(tiny) == {"window": 528, "compressed": 26.5 + 53, "token_id": 4, "total": 611.5}
    real = V41Config.from_file(FIXTURES / "official_config.json").text
    # MODEL.md §4.6: 528 B of window KV per layer and token; 890 B/token of global KV
    assert kv_bytes_per_token(real) == {"window": 40 * 528, "compressed": 890, "token_id": 4, "total": 22014}
