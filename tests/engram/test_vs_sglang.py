"""Engram hashing against SGLang 0.5.23's own implementation (`sglang.srt.layers.engram`).

Upstream SGLang serves V4.1 with FP8 tables; whatever the table format, a token must land on
the same rows there and here, or the MXFP4 tables we serve would be read at the wrong places.
Its token map, prime layout, multipliers and hash are an independent implementation of
MODEL.md §8, so each is compared with ours on the real tokenizer and the official config.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from sglang_ds41.assets import TOKENIZER_JSON
from sglang_ds41.config import V41Config
from sglang_ds41.engram.hashing import EngramHasher
from sglang_ds41.engram.layout import EngramLayout
from sglang_ds41.engram.token_map import load_token_map


@pytest.fixture(scope="module")
def upstream():
    return pytest.importorskip("sglang.srt.layers.engram")


@pytest.fixture(scope="module")
def upstream_token_map(upstream) -> tuple[list[int], int]:
    from transformers import PreTrainedTokenizerFast

    return upstream.build_compressed_token_map(PreTrainedTokenizerFast(tokenizer_file=str(TOKENIZER_JSON)))


def test_token_map_is_upstreams_id_for_id(upstream_token_map, engram_cache_dir):
    theirs, size = upstream_token_map
    ours = load_token_map(TOKENIZER_JSON, cache_dir=engram_cache_dir)
    assert size == int(ours.max()) + 1 == 99_092
    assert np.array_equal(ours, np.asarray(theirs))


def test_primes_row_bounds_and_multipliers_are_upstreams(upstream, official_config: V41Config):
    text = official_config.text
    theirs = upstream.EngramLayout.from_config(text)
    ours = EngramLayout.from_config(text)
    for i, layer in enumerate(ours.layers):
        assert list(layer.primes) == [p for per_ngram in theirs.primes[i] for p in per_ngram]
        assert tuple(layer.column_starts()) == theirs.column_bounds(i)
    multipliers = upstream.compute_hash_multipliers(
        theirs.layer_ids, theirs.max_ngram_size, text.engram_compressed_vocab_size
    )
    assert torch.equal(ours.multipliers_tensor(), multipliers)


def test_row_ids_of_token_sequences_are_upstreams(
    upstream, upstream_token_map, official_config: V41Config, engram_cache_dir
):
    text = official_config.text
    layout = upstream.EngramLayout.from_config(text)
    token_map = torch.tensor(upstream_token_map[0])
    flat = [[p for per_ngram in layer for p in per_ngram] for layer in layout.primes]
    offsets = torch.tensor(np.array([np.cumsum([0, *sizes[:-1]]) for sizes in flat]))
    multipliers = upstream.compute_hash_multipliers(
        layout.layer_ids, layout.max_ngram_size, upstream_token_map[1]
    )
    hasher = EngramHasher.for_tokenizer(official_config, TOKENIZER_JSON, cache_dir=engram_cache_dir)
    generator = torch.Generator().manual_seed(0)
    n = layout.max_ngram_size
    for length in (1, 2, 7, 300):
        ids = torch.randint(0, token_map.numel(), (length,), generator=generator)
        ids[::5] = torch.randint(0, 20, ((length + 4) // 5,), generator=generator)  # frequent ids too
        shifts = torch.arange(n)
        positions = torch.arange(length)
        tokens = ids[(positions[:, None] - shifts).clamp_min(0)]  # [T, n]: the token, its predecessors
        blocked = positions[:, None] < shifts  # look-back before the sequence start
        theirs = upstream.compute_engram_hash_ids(
            tokens,
            blocked,
            int(token_map[text.engram_pad_token_id]),
            token_map,
            multipliers,
            torch.tensor(layout.primes),
            offsets,
        )
        assert torch.equal(hasher.hash_sequence(ids), theirs), length


def test_gate_equals_upstreams_except_at_an_exactly_zero_dot(upstream):
    """`engram_gate` (SGLang's torch path, fp32) and our `apply_engram` on the same inputs, image
    rows included. One documented difference: MODEL.md §5.6 takes sign(dot), so a dot of exactly
    0 (an all-zero residual copy) gates at sigmoid(0) = 0.5; SGLang's copysign gives +-1e-3 under
    the sigmoid (0.50025). Anywhere else the two agree to float32 rounding."""
    from sglang_ds41.engram.gate import apply_engram, gate_weight

    generator = torch.Generator().manual_seed(0)
    t, hc, d, eps, image = 64, 4, 32, 1e-20, 7
    x = torch.randn(t, hc, d, generator=generator) * 3
    kv = torch.randn(t, (hc + 1) * d, generator=generator)
    q, k = torch.randn(hc, d, generator=generator), torch.randn(hc, d, generator=generator)
    ids = torch.randint(0, 10, (t,), generator=generator)
    ids[::9] = image
    x[5, 2] = 0.0  # an exactly zero dot
    theirs = upstream.engram_gate(x, kv, q, k, eps, 1e-6, ids, image)
    ours = apply_engram(x, kv, gate_weight(q, k), eps, ids == image)
    rows = torch.ones(t, hc, dtype=torch.bool)
    rows[5, 2] = False
    assert torch.allclose(ours[rows], theirs[rows], rtol=0, atol=2e-6)  # updates are O(1)
    assert torch.equal(ours[ids == image], x[ids == image]) and torch.equal(
        theirs[ids == image], x[ids == image]
    )
    value = kv[5, hc * d :]
    assert torch.allclose(ours[5, 2], 0.5 * value) and torch.allclose(
        theirs[5, 2], torch.sigmoid(torch.tensor(1e-3)) * value
    )
