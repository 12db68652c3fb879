"""The ViT, aligner and placement (MODEL.md §7.2-7.3) against hand-computed values and an
independent float64 numpy transcription of the spec, loop by loop."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from sglang_ds41.config import VisionConfig
from sglang_ds41.errors import Ds41Error
from sglang_ds41.model.rope import rope_frequencies
from sglang_ds41.model.vision import VisionTower, merge_cells, place_image, rotate_half, vision_rope_angles

# The §11 tiny tower (hidden 32, 2 heads of 16, patch 2), with two blocks.
TINY = VisionConfig("deepseek_v41_vision", 2, 32, 2, 32, 2, 10000, 3, 64, 16)
LM_DIM = 24


def random_tower(seed: int = 0) -> VisionTower:
    tower = VisionTower(TINY, LM_DIM).double()
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in tower.named_parameters():
            noise = torch.randn(p.shape, generator=gen, dtype=torch.float64)
            if "norm" in name:
                p.copy_(1 + 0.2 * noise)
            elif p.ndim == 2:
                p.copy_(noise / math.sqrt(p.shape[1]))
            else:
                p.copy_(0.3 * noise)
    return tower.requires_grad_(False)


def test_rope_frequencies_and_angles_by_hand():
    # head_dim 16 -> 8 angles per head, 4 frequencies 10000^(-2i/8) = 10^-i.
    freqs = rope_frequencies(TINY.hidden_size // TINY.num_attention_heads // 2, TINY.rope_theta)
    assert freqs.tolist() == pytest.approx([1, 0.1, 0.01, 0.001], rel=1e-12)
    angles = vision_rope_angles(3, 4, freqs)  # 3 rows x 4 columns of patches
    assert angles.shape == (12, 8)
    # Patch 11 is row y = 2, column x = 3: [y * f..., x * f...].
    assert angles[11].tolist() == pytest.approx([2, 0.2, 0.02, 0.002, 3, 0.3, 0.03, 0.003], rel=1e-12)
    assert angles[1].tolist() == pytest.approx([0, 0, 0, 0, 1, 0.1, 0.01, 0.001], rel=1e-12)


def test_rotate_half_pairs_channel_i_with_i_plus_half():
    h = torch.tensor([[[1.0, 0, 0, 0, 0, 1, 0, 0]]], dtype=torch.float64)  # [N=1, heads=1, 8]
    angles = torch.tensor([[math.pi / 2, math.pi / 2, 0.0, 0.0]], dtype=torch.float64)
    # pair 0: (1, 0) -> (cos, sin) = (0, 1); pair 1: (0, 1) -> (-sin, cos) = (-1, 0).
    out = rotate_half(h, angles)[0, 0]
    assert out.tolist() == pytest.approx([0, -1, 0, 0, 1, 0, 0, 0], abs=1e-15)


def test_merge_cells_zero_pads_and_uses_unfold_order():
    h, w, c, r = 4, 5, 2, 3
    x = torch.arange(h * w * c, dtype=torch.float64).view(h, w, c) + 1
    cells = merge_cells(x, r)
    assert cells.shape == (2, 2, c * r * r)
    # Oracle: PyTorch's unfold over the channel-first padded map, cells in row-major order.
    padded = F.pad(x.permute(2, 0, 1), (0, -w % r, 0, -h % r))
    unfolded = F.unfold(padded[None], r, stride=r)[0].T  # [cells, C * r * r]
    assert torch.equal(cells.reshape(4, -1), unfolded)
    # By hand: cell (1, 1) element (c=1, dy=0, dx=1) is x[3, 4, 1]; (dy=1) falls in the padding.
    assert cells[1, 1, 1 * 9 + 0 * 3 + 1] == x[3, 4, 1]
    assert cells[1, 1, 1 * 9 + 1 * 3 + 0] == 0


def test_place_image_order():
    cells = torch.arange(2 * 3, dtype=torch.float64).view(2, 3, 1) + 10
    start, newline, end = (torch.tensor([v], dtype=torch.float64) for v in (-1.0, -2.0, -3.0))
    span = place_image(cells, start, newline, end)[:, 0].tolist()
    assert span == [-1, 10, 11, 12, -2, 13, 14, 15, -2, -3]  # n_h * (n_w + 1) + 2 = 10 rows


def numpy_tower(tower: VisionTower, patches: np.ndarray, n_vit_h: int, n_vit_w: int) -> np.ndarray:
    """§7.2-7.3 written out with explicit loops over heads, patches and cells."""
    p = {k: v.numpy() for k, v in tower.state_dict().items()}
    heads, c = TINY.num_attention_heads, TINY.hidden_size
    hd, inter, r = c // heads, TINY.intermediate_size, TINY.downsample_ratio

    def rms(v, w):
        return v / np.sqrt((v**2).mean(-1, keepdims=True) + 1e-6) * w

    nu = [TINY.rope_theta ** (-2 * i / (hd // 2)) for i in range(hd // 4)]
    n = n_vit_h * n_vit_w
    theta = np.zeros((n, hd // 2))
    for idx in range(n):
        y, x_ = divmod(idx, n_vit_w)
        theta[idx] = [y * f for f in nu] + [x_ * f for f in nu]

    def rot(v):  # v [N, hd]
        out = v.copy()
        for i in range(hd // 2):
            a, b = v[:, i], v[:, i + hd // 2]
            out[:, i] = a * np.cos(theta[:, i]) - b * np.sin(theta[:, i])
            out[:, i + hd // 2] = b * np.cos(theta[:, i]) + a * np.sin(theta[:, i])
        return out

    x = patches.reshape(n, -1) @ p["vision.patch_embed.proj.weight"].T + p["vision.patch_embed.proj.bias"]
    for b in range(TINY.num_hidden_layers):
        pre = f"vision.blocks.{b}."
        hn = rms(x, p[pre + "norm1.weight"])
        qkv = hn @ p[pre + "attn.wqkv.weight"].T + p[pre + "attn.wqkv.bias"]
        outs = []
        for j in range(heads):
            q = rot(qkv[:, j * hd : (j + 1) * hd])
            k = rot(qkv[:, c + j * hd : c + (j + 1) * hd])
            v = qkv[:, 2 * c + j * hd : 2 * c + (j + 1) * hd]
            s = q @ k.T / math.sqrt(hd)
            e = np.exp(s - s.max(-1, keepdims=True))
            outs.append((e / e.sum(-1, keepdims=True)) @ v)
        x = x + np.concatenate(outs, -1) @ p[pre + "attn.wo.weight"].T + p[pre + "attn.wo.bias"]
        hn = rms(x, p[pre + "norm2.weight"])
        gu = hn @ p[pre + "mlp.w1.weight"].T
        g, u = gu[:, :inter], gu[:, inter:]
        x = x + (g / (1 + np.exp(-g)) * u) @ p[pre + "mlp.w2.weight"].T
    x = rms(x, p["vision.norm.weight"]).reshape(n_vit_h, n_vit_w, c)
    n_h, n_w = -(-n_vit_h // r), -(-n_vit_w // r)
    rows = [p["image_start"]]
    for i in range(n_h):
        for jj in range(n_w):
            vec = np.zeros(c * r * r)
            for ch in range(c):
                for dy in range(r):
                    for dx in range(r):
                        yy, xx = i * r + dy, jj * r + dx
                        if yy < n_vit_h and xx < n_vit_w:
                            vec[ch * r * r + dy * r + dx] = x[yy, xx, ch]
            a = vec @ p["aligner.w1.weight"].T + p["aligner.w1.bias"]
            a = 0.5 * a * (1 + np.vectorize(math.erf)(a / math.sqrt(2)))
            rows.append(a @ p["aligner.w2.weight"].T + p["aligner.w2.bias"])
        rows.append(p["image_newline"])
    rows.append(p["image_end"])
    return np.stack(rows)


@pytest.mark.parametrize(("n_vit_h", "n_vit_w"), [(4, 5), (6, 6), (1, 7)])
def test_tower_matches_numpy_transcription(n_vit_h, n_vit_w):
    tower = random_tower()
    patches = torch.randn(
        n_vit_h * n_vit_w, 3, 2, 2, generator=torch.Generator().manual_seed(1), dtype=torch.float64
    )
    span = tower(patches, n_vit_h, n_vit_w)
    n_h, n_w = -(-n_vit_h // 3), -(-n_vit_w // 3)
    assert span.shape == (n_h * (n_w + 1) + 2, LM_DIM)
    expected = numpy_tower(tower, patches.numpy(), n_vit_h, n_vit_w)
    np.testing.assert_allclose(span.numpy(), expected, rtol=1e-10, atol=1e-12)


def test_attention_is_bidirectional_and_per_image():
    tower = random_tower()
    gen = torch.Generator().manual_seed(2)
    patches = torch.randn(36, 3, 2, 2, generator=gen, dtype=torch.float64)
    base = tower(patches, 6, 6)
    changed = patches.clone()
    changed[-1] += 1.0  # the last patch (bottom-right cell) changes the first cell too
    assert not torch.allclose(tower(changed, 6, 6)[1], base[1])


def test_rejects_patches_that_do_not_match_the_grid():
    with pytest.raises(Ds41Error, match="expected patches of shape"):
        random_tower()(torch.zeros(10, 3, 2, 2, dtype=torch.float64), 3, 3)


def test_rejects_head_dim_without_room_for_two_d_rope():
    bad = VisionConfig("deepseek_v41_vision", 1, 36, 6, 32, 2, 10000, 3, 64, 16)  # head_dim 6
    with pytest.raises(Ds41Error, match="multiple of 4"):
        VisionTower(bad, 8)


def test_official_shapes_with_one_block():
    official = VisionConfig("deepseek_v41_vision", 1, 1024, 16, 2816, 14, 10000, 3, 1024, 295936)
    tower = VisionTower(official, 5120)
    shapes = {k: tuple(v.shape) for k, v in tower.state_dict().items()}
    assert shapes["vision.patch_embed.proj.weight"] == (1024, 588)
    assert shapes["vision.blocks.0.attn.wqkv.weight"] == (3072, 1024)
    assert shapes["vision.blocks.0.mlp.w1.weight"] == (5632, 1024)
    assert shapes["vision.blocks.0.mlp.w2.weight"] == (1024, 2816)
    assert shapes["aligner.w1.weight"] == (5120, 9216)
    assert shapes["aligner.w2.weight"] == (5120, 5120)
    assert tower.vision.rope_dim == 32
