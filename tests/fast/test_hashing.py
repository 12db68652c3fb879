"""The compiled Engram hash rows (`fast.hashing.rows`) against the hasher's own path (history
rebuilt from the raw ids before each chunk, then `extend`), on ragged batches of decode steps
and prefill chunks whose look-backs hold dead ids (negative, image, past the map) and reach
before the sequence start, with the official layout's multipliers and primes."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from sglang_ds41.config import V41Config
from sglang_ds41.engram.hashing import EngramHasher
from sglang_ds41.fast.hashing import rows

OFFICIAL_CONFIG = Path(__file__).parent.parent / "fixtures" / "official_config.json"


@pytest.fixture(scope="module")
def hasher() -> EngramHasher:
    config = V41Config.from_file(OFFICIAL_CONFIG)
    gen = torch.Generator().manual_seed(0)
    token_map = torch.randint(0, 99_092, (129_280,), generator=gen)
    token_map[:99_092] = torch.arange(99_092)  # the largest compressed id is used
    return EngramHasher.from_config(config, token_map)


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("decode", [True, False])
def test_the_compiled_rows_equal_the_hasher(hasher: EngramHasher, seed: int, decode: bool):
    gen = torch.Generator().manual_seed(seed)
    dead = [-1, hasher.image_token_id, 129_280, 200_000]
    for trial in range(40):
        requests = int(torch.randint(1, 7, (1,), generator=gen))
        lengths = torch.ones(requests, dtype=torch.int64)
        if not decode:
            lengths = torch.randint(0, 9, (requests,), generator=gen)
        counts = torch.randint(0, hasher.history_len + 1, (requests,), generator=gen)
        before = torch.randint(0, 129_280, (int(counts.sum()),), generator=gen)
        ids = torch.randint(99_000, 99_092, (int(lengths.sum()),), generator=gen)  # large products
        for t in (before, ids):
            if t.numel() and trial % 2:
                at = torch.randint(0, t.numel(), (2,), generator=gen)
                t[at] = torch.tensor([dead[trial % 4], dead[(trial + 1) % 4]])
        want, _ = hasher.extend(hasher.history_of(before, counts), ids, lengths)
        got = rows(hasher, before, counts, ids, lengths)
        assert got.shape == want.shape and torch.equal(got, want), (trial, lengths, counts)
