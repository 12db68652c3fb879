"""Placeholder expansion: one id per image in, n_h * (n_w + 1) + 2 image positions out."""

from __future__ import annotations

import pytest
import torch
from PIL import Image

from sglang_ds41.errors import Ds41Error
from sglang_ds41.vision.expand import build_image_prompt, expand_image_ids
from sglang_ds41.vision.grid import GridSpec
from sglang_ds41.vision.preprocess import preprocess_image
from sglang_ds41.vision.weights import load_vision_tower

IMG = 9
TINY = GridSpec(patch_size=2, downsample_ratio=3, max_image_tokens=64, min_pixels=16)


def test_expand_ids_by_hand():
    ids, spans = expand_image_ids([1, IMG, 2, 3, IMG], [3, 2], IMG)
    assert ids == [1, IMG, IMG, IMG, 2, 3, IMG, IMG]
    assert spans == [(1, 3), (6, 2)]
    assert expand_image_ids([4, 5], [], IMG) == ([4, 5], [])


@pytest.mark.parametrize(("ids", "counts"), [([1, IMG], []), ([1, 2], [3]), ([IMG, IMG], [4])])
def test_placeholder_and_image_counts_must_agree(ids, counts):
    with pytest.raises(Ds41Error, match="image placeholders"):
        expand_image_ids(ids, counts, IMG)


def test_build_image_prompt_puts_each_span_at_its_placeholder(tiny_dir):
    tower = load_vision_tower(tiny_dir, torch.float64)
    image_id = 129264
    a = preprocess_image(Image.new("RGB", (12, 12), (200, 10, 10)), TINY, dtype=torch.float64)
    b = preprocess_image(Image.new("RGB", (20, 10), (10, 200, 10)), TINY, dtype=torch.float64)
    assert (a.token_count, b.token_count) == (8, 12)  # 2x2 cells; 2 rows x 4 cells
    prompt = build_image_prompt([5, image_id, 6, 7, image_id, 8], [a, b], tower, image_id)
    assert prompt.input_ids.tolist() == [5] + [image_id] * 8 + [6, 7] + [image_id] * 12 + [8]
    assert prompt.spans == ((1, 8), (11, 12))
    assert prompt.is_image.sum() == 20 == prompt.image_embeds.shape[0]
    assert torch.equal(prompt.image_embeds[:8], tower(a.patches, 6, 6))
    assert torch.equal(prompt.image_embeds[8:], tower(b.patches, 5, 10))
