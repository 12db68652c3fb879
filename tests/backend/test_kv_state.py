"""The slot-indexed state layout: what it costs per token of context."""

from __future__ import annotations

from pathlib import Path

from sglang_ds41.backend.kv_state import kv_bytes_per_token
from sglang_ds41.config import V41Config

FIXTURES = Path(__file__).parent.parent / "fixtures"


def test_state_bytes_per_token_of_the_layout():
    tiny = V41Config.from_file(FIXTURES / "tiny_config.json").text
    # window 8 layers x 64 x 8 B; sources: layer 2 ratio 2 (64 + 32) * 8 / 2, layer 4 ratio 1 (64 + 32) * 8
    assert kv_bytes_per_token(tiny, 8) == {
        "window": 4096,
        "compressed": 384 + 768,
        "token_id": 4,
        "total": 5252,
    }
    real = V41Config.from_file(FIXTURES / "official_config.json").text
    # bf16: 40 x 512 x 2 window; ratio 1 (layer 20): 640 x 2; three ratio-2 sources: 640 x 2 / 2 each
    assert kv_bytes_per_token(real, 2)["total"] == 40960 + 1280 + 3 * 640 + 4
