"""The slot-indexed state layout: what it costs per token of context."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from sglang_ds41.backend.kv_state import (
    PoolViews,
    SlotState,
    SlotStateError,
    kv_bytes_per_token,
    pool_row_bytes,
)
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


def test_sglang_pool_rows_hold_exactly_the_layout():
    """The geometry SGLang's pools get (launch_hooks): a full-side row per slot = token id +
    each KV source's share of an entry (a ratio-2 entry split over its pair's two slots, padded
    to whole bytes), a window row per SWA slot and layer."""
    tiny = V41Config.from_file(FIXTURES / "tiny_config.json").text
    assert pool_row_bytes(tiny) == (4 + 27 + 53, 66)  # 53 = 36 + 17: odd, so pieces of 27
    real = V41Config.from_file(FIXTURES / "official_config.json").text
    assert pool_row_bytes(real) == (4 + 3 * 178 + 356, 528)  # = 894: no padding


def test_pool_buffers_narrower_than_the_rows_are_refused_by_name():
    tiny = V41Config.from_file(FIXTURES / "tiny_config.json").text
    full, window = pool_row_bytes(tiny)
    narrow = PoolViews(torch.zeros(64, full - 1, dtype=torch.uint8), {})
    with pytest.raises(SlotStateError, match=r"full pool's K buffer is torch.uint8 \[64, 83\], expected"):
        SlotState(tiny, 64, 4, torch.float64, window_rows=32, pool=narrow)
    layers = {layer: torch.zeros(32, window - 2, dtype=torch.uint8) for layer in range(1, 8)}
    with pytest.raises(SlotStateError, match=r"layer 1's SWA K buffer .* --kv-cache-dtype"):
        SlotState(
            tiny,
            64,
            4,
            torch.float64,
            window_rows=32,
            pool=PoolViews(torch.zeros(64, full, dtype=torch.uint8), layers),
        )
