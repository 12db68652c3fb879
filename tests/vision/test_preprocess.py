"""Pixels: letterbox on grey, normalisation and patch order (MODEL.md §7.1 steps 4-5)."""

from __future__ import annotations

import base64
import types

import numpy as np
import pytest
import torch
from PIL import Image

from sglang_ds41.vision.grid import GridSpec
from sglang_ds41.vision.preprocess import patchify, preprocess_image

from .conftest import encode

TINY = GridSpec(patch_size=2, downsample_ratio=3, max_image_tokens=64, min_pixels=16)
GREY = (127 / 255 - 0.5) / 0.5


def bf16(v: float) -> float:
    return float(torch.tensor(v, dtype=torch.bfloat16))


def test_letterbox_centres_the_picture_on_grey():
    # 640x480 -> canvas 644x490. Fitting the width: height round(480 / 640 * 644) = 483, offset
    # round((490 - 483) / 2) = round(3.5) = 4, so rows 0-3 and 487-489 are grey padding.
    out = preprocess_image(Image.new("RGB", (640, 480), (255, 0, 0)))
    assert out.patches.dtype == torch.bfloat16
    grid = out.grid
    assert out.patches.shape == (grid.n_patches, 3, 14, 14) == (35 * 46, 3, 14, 14)
    x = out.patches.view(35, 46, 3, 14, 14).permute(2, 0, 3, 1, 4).reshape(3, 490, 644)  # [3, H, W]
    assert torch.all(x[:, :4] == bf16(GREY)) and torch.all(x[:, 487:] == bf16(GREY))
    assert torch.all(x[0, 4:487] == 1.0) and torch.all(x[1:, 4:487] == -1.0)  # red, full width


def test_patch_order_is_row_major_and_channel_major_inside():
    # A 12x12 picture is exactly the tiny canvas (no resize): pixel (y, x, c) = its own index.
    pixels = np.arange(12 * 12 * 3, dtype=np.int64).reshape(12, 12, 3) % 251
    out = preprocess_image(Image.fromarray(pixels.astype(np.uint8)), TINY, dtype=torch.float64)
    assert out.patches.shape == (36, 3, 2, 2) and out.token_count == 8
    for r, c, ch, dy, dx in [
        (0, 0, 0, 0, 0),
        (0, 1, 2, 1, 0),
        (1, 0, 1, 0, 1),
        (5, 4, 2, 1, 1),
        (3, 5, 0, 1, 1),
    ]:
        value = pixels[2 * r + dy, 2 * c + dx, ch]
        got = out.patches[6 * r + c, ch, dy, dx]
        assert got == pytest.approx((value / 255 - 0.5) / 0.5, abs=1e-6), (r, c, ch, dy, dx)


def test_patchify_inverts_a_reshape():
    x = torch.arange(3 * 4 * 6, dtype=torch.float32).view(3, 4, 6)
    tiles = patchify(x, 2)  # 2 rows x 3 columns of 2x2 tiles
    assert torch.equal(tiles[4], x[:, 2:4, 2:4])  # row 1, column 1
    assert torch.equal(tiles[2], x[:, 0:2, 4:6])


def test_sources_give_the_same_patches_as_the_picture():
    picture = Image.effect_noise((30, 20), 40).convert("RGB")
    data = encode(picture)
    url = "data:image/png;base64," + base64.b64encode(data).decode()
    ref = preprocess_image(picture).patches
    assert torch.equal(preprocess_image(data).patches, ref)
    assert torch.equal(preprocess_image(url).patches, ref)


def test_low_detail_gives_fewer_patches():
    picture = Image.new("RGB", (1920, 1080), (0, 128, 255))
    out = preprocess_image(picture, detail="low")
    assert (out.grid.width, out.grid.height, out.token_count) == (728, 420, 192)
    assert out.patches.shape[0] == (728 // 14) * (420 // 14)


def test_matches_sglang_processor_bit_for_bit():
    """SGLang's own preprocessing (the spec's source) is the oracle where it is installed."""
    sgl = pytest.importorskip("sglang.srt.multimodal.deepseek_v41_image_processing")
    args = types.SimpleNamespace(
        vision_patch_size=14,
        vision_max_wh_ratio=None,
        vision_min_pixels=295936,
        vision_downsample_ratio=3,
        vision_max_n_token=1024,
    )
    rng = np.random.default_rng(0)
    for w, h in [(640, 480), (97, 203), (1500, 400), (8, 8)]:
        picture = Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8))
        patches, n_vit_h, n_vit_w, n_h, n_w = sgl.patchify_image(picture, args)
        out = preprocess_image(picture)
        assert (out.grid.n_vit_h, out.grid.n_vit_w, out.grid.n_h, out.grid.n_w) == (
            n_vit_h,
            n_vit_w,
            n_h,
            n_w,
        )
        assert torch.equal(out.patches, patches), (w, h)
