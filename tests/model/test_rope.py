import math

import pytest
import torch

from sglang_ds41.config import RopeScaling
from sglang_ds41.model.rope import RotaryEmbedding, rope_frequencies, yarn_band

from ._tiny import tiny_config

OFFICIAL_YARN = RopeScaling("yarn", 16.0, 32.0, 1.0, 65536)


def closed_form_yarn(dim: int, base: float, factor: float, beta_fast: float, beta_slow: float, orig: int):
    """§4.2 written out independently: correction band, linear ramp, blend of f and f/factor."""
    def band_edge(beta):
        return dim * math.log(orig / (beta * 2 * math.pi)) / (2 * math.log(base))

    lo = max(0, math.floor(band_edge(beta_fast)))
    hi = min(dim - 1, math.ceil(band_edge(beta_slow)))
    out = []
    for i in range(dim // 2):
        f = 1.0 / base ** (2 * i / dim)
        ramp = min(1.0, max(0.0, (i - lo) / (hi - lo)))
        out.append(f * (1 - ramp) + f / factor * ramp)
    return lo, hi, out


def test_official_yarn_band_is_15_to_25():
    assert yarn_band(64, 160000.0, OFFICIAL_YARN) == (15, 25)


def test_official_yarn_frequencies_match_closed_form():
    lo, hi, expected = closed_form_yarn(64, 160000.0, 16.0, 32.0, 1.0, 65536)
    freqs = rope_frequencies(64, 160000.0, OFFICIAL_YARN)
    assert torch.allclose(freqs, torch.tensor(expected, dtype=torch.float64), rtol=1e-14, atol=0)
    # Below the band: untouched; above it: divided by the factor.
    assert freqs[lo] == 160000.0 ** (-2 * lo / 64)
    assert freqs[hi + 1] == pytest.approx(160000.0 ** (-2 * (hi + 1) / 64) / 16, rel=1e-14)


def test_tiny_compressed_layers_use_compress_theta_with_yarn_band_0_to_2():
    cfg = tiny_config()
    assert yarn_band(16, 160000.0, cfg.rope_scaling) == (0, 2)
    _, _, expected = closed_form_yarn(16, 160000.0, 16.0, 32.0, 1.0, 32)
    for ratio in (1, 2):
        rope = RotaryEmbedding.for_layer(cfg, ratio)
        assert torch.allclose(rope.freqs, torch.tensor(expected, dtype=torch.float64), rtol=1e-14, atol=0)


def test_window_only_layers_use_rope_theta_without_yarn():
    rope = RotaryEmbedding.for_layer(tiny_config(), 0)
    expected = [10000.0 ** (-2 * i / 16) for i in range(8)]
    assert torch.allclose(rope.freqs, torch.tensor(expected, dtype=torch.float64), rtol=1e-15, atol=0)


def test_rotation_is_on_interleaved_pairs_of_the_trailing_channels():
    rope = RotaryEmbedding(torch.tensor([0.5, 0.25], dtype=torch.float64))
    x = torch.tensor([[7.0, 1.0, 0.0, 0.0, 1.0]], dtype=torch.float64)  # 1 free + 2 pairs
    y = rope(x, torch.tensor([3]))
    # pair 0 = (1, 0) rotated by 1.5 rad; pair 1 = (0, 1) rotated by 0.75 rad
    expected = [7.0, math.cos(1.5), math.sin(1.5), -math.sin(0.75), math.cos(0.75)]
    assert torch.allclose(y, torch.tensor([expected], dtype=torch.float64), rtol=0, atol=1e-15)
    assert torch.allclose(rope(y, torch.tensor([3]), inverse=True), x, rtol=0, atol=1e-15)


def test_rotated_dot_products_depend_only_on_relative_position():
    rope = RotaryEmbedding.for_layer(tiny_config(), 2)
    gen = torch.Generator().manual_seed(0)
    q, k = torch.randn(2, 1, 64, generator=gen, dtype=torch.float64)
    a = (rope(q, torch.tensor([10])) * rope(k, torch.tensor([3]))).sum()
    b = (rope(q, torch.tensor([107])) * rope(k, torch.tensor([100]))).sum()
    assert a.item() == pytest.approx(b.item(), rel=1e-12)
