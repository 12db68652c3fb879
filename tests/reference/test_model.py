"""The assembled reference model on random TINY weights (MODEL.md §2, §11): no checkpoint needed."""

from __future__ import annotations

import pytest
import torch

from sglang_ds41.errors import Ds41Error

from ._feed import feed, rel_diff
from ._random import IMAGE_ID, random_tiny_model

F64 = torch.float64
IMAGE = slice(10, 18)  # 8 image positions; the chunk boundary at 13 cuts the span


def _sequence(n: int = 48, seed: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, IMAGE_ID, (n,), generator=gen)
    ids[IMAGE] = IMAGE_ID
    image_embeds = torch.randn(IMAGE.stop - IMAGE.start, 64, generator=gen, dtype=F64)
    return ids, image_embeds


@pytest.fixture(scope="module")
def model64():
    return random_tiny_model(seed=0, dtype=F64)


def test_chunked_prefill_and_decode_equal_one_shot_in_float64(model64):
    ids, image = _sequence()  # 40 prompt tokens + 8 decode steps
    one_shot = feed(model64, ids, image, [48])
    chunked = feed(model64, ids, image, [13, 14, 13] + [1] * 8)  # odd boundaries, image straddles 13
    assert rel_diff(chunked, one_shot) < 1e-12
    other = feed(model64, ids, image, [1, 2, 5, 9, 11, 7, 13])
    assert rel_diff(other, one_shot) < 1e-12


def test_chunked_prefill_and_decode_match_one_shot_in_float32():
    model = random_tiny_model(seed=0, dtype=torch.float32)
    ids, image = _sequence()
    image = image.float()
    one_shot = feed(model, ids, image, [48])
    chunked = feed(model, ids, image, [13, 14, 13] + [1] * 8)
    # GEMM rounding depends on the row count; see reference.generate.SELFTEST_TOLERANCE.
    assert rel_diff(chunked, one_shot) < 1e-4


def test_logits_are_causal_in_the_tokens_after_them(model64):
    ids, image = _sequence()
    base = feed(model64, ids, image, [48])
    changed = ids.clone()
    changed[30:] = (changed[30:] + 1) % IMAGE_ID
    other = feed(model64, changed, image, [48])
    assert rel_diff(other[:30], base[:30]) < 1e-12
    assert not torch.allclose(base[30:], other[30:])


def test_image_embeddings_replace_the_image_positions_only(model64):
    ids, image = _sequence()
    base = feed(model64, ids, image, [48])
    other = feed(model64, ids, image + 1, [48])
    assert rel_diff(other[: IMAGE.start], base[: IMAGE.start]) < 1e-12
    assert (base[IMAGE] - other[IMAGE]).abs().amax(-1).min() > 1e-3


def test_image_rows_are_dead_for_engram(model64):
    ids, image = _sequence()
    seen = []
    for layer in (1, 2):  # the TINY Engram layers
        block = model64.layers[layer]
        block.engram.register_forward_hook(lambda mod, args, out: seen.append((args[0], out)))
    feed(model64, ids, image, [48])
    for residual, out in seen:
        assert torch.equal(out[IMAGE], residual[IMAGE])
        assert (out[: IMAGE.start] != residual[: IMAGE.start]).any(dim=-1).all()


def test_image_tokens_route_with_bias_vl(model64):
    ids, image = _sequence()
    base = feed(model64, ids, image, [48])
    gate = model64.layers[0].ffn.gate
    saved = gate.bias_vl.detach().clone()
    with torch.no_grad():
        gate.bias_vl.copy_(-saved)  # a different expert choice for image rows only
    try:
        other = feed(model64, ids, image, [48])
    finally:
        with torch.no_grad():
            gate.bias_vl.copy_(saved)
    assert rel_diff(other[: IMAGE.start], base[: IMAGE.start]) < 1e-12
    assert not torch.allclose(base[IMAGE], other[IMAGE])


def test_image_span_is_start_rows_with_newlines_end(model64):
    cells = torch.arange(2 * 3 * 64, dtype=F64).view(2, 3, 64)
    span = model64.image_span(cells)
    start, newline, end = model64.image_start, model64.image_newline, model64.image_end
    want = [
        start,
        cells[0, 0],
        cells[0, 1],
        cells[0, 2],
        newline,
        cells[1, 0],
        cells[1, 1],
        cells[1, 2],
        newline,
        end,
    ]
    assert span.shape == (2 * (3 + 1) + 2, 64)
    for row, expected in zip(span, want, strict=True):
        assert torch.equal(row, expected)


def test_image_positions_without_embeddings_are_refused(model64):
    ids, image = _sequence()
    with pytest.raises(Ds41Error, match="8 image positions"):
        model64(ids, model64.new_state())
    with pytest.raises(Ds41Error, match="image_embeds"):
        model64(ids, model64.new_state(), image[:3])


def test_state_counts_positions_and_keeps_bounded_windows(model64):
    ids, _ = _sequence()
    state = model64.new_state()
    model64(ids[: IMAGE.start], state)
    assert state.position == IMAGE.start
    assert all(s.window.shape[0] == 8 for s in state.attention)  # sliding_window
    assert state.attention[2].compressed.kv.shape[0] == IMAGE.start // 2  # ratio-2 entries
    assert state.attention[2].compressed.pending is None  # even length: no half pair
    assert state.attention[4].compressed.kv.shape[0] == IMAGE.start  # ratio 1
