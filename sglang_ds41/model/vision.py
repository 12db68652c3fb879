"""The vision tower: ViT, 3x3 aligner and span placement (MODEL.md §7.2, §7.3).

    x      = patch_embed(patches)                               [N, C]   N = n_vit_h * n_vit_w
    for each block: x += Attn(norm1(x)); x += MLP(norm2(x))     full attention within one image
    x      = norm(x)
    cells  = aligner(merge 3x3 patch cells of x)               [n_h, n_w, D]
    span   = START, (cells of row i, NEWLINE) for each row, END [n_h * (n_w + 1) + 2, D]

Attention uses 2-D RoPE on all 64 channels of q and k: the first half of the angles follows the
patch row y, the second half the column x (`vision_rope_angles`), applied "rotate-half" style
(channel i pairs with channel i + head_dim/2), unlike the LM's interleaved pairs in `rope`.

Parameter names follow the checkpoint (`vision.blocks.b.attn.wqkv`, `aligner.w1`,
`image_start`, ...). Norms use eps 1e-6 (not the LM's `rms_norm_eps`); RoPE and norms run in
"fp32 math" (`norm.upcast`), linears in the module dtype. Images are independent: one call
embeds one image, so a batch is a loop (or, in the backend, a block-diagonal mask).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from sglang_ds41.config import VisionConfig
from sglang_ds41.errors import Ds41Error

from .norm import RMSNorm, upcast
from .rope import rope_frequencies

VISION_NORM_EPS = 1e-6


def vision_rope_angles(n_vit_h: int, n_vit_w: int, freqs: torch.Tensor) -> torch.Tensor:
    """[N, 2F] float64 angles of the patches in row-major order: [y * freqs, x * freqs]."""
    y = torch.arange(n_vit_h, dtype=torch.float64).repeat_interleave(n_vit_w)  # [N]
    x = torch.arange(n_vit_w, dtype=torch.float64).repeat(n_vit_h)  # [N]
    freqs = freqs.to(torch.float64)
    return torch.cat([y[:, None] * freqs, x[:, None] * freqs], dim=-1)


def rotate_half(h: torch.Tensor, angles: torch.Tensor) -> torch.Tensor:
    """h [N, heads, hd] rotated in pairs (h[i], h[i + hd/2]) by angles [N, hd/2]; fp32 math."""
    x1, x2 = upcast(h).chunk(2, dim=-1)
    cos = angles.cos()[:, None, :].to(x1.dtype)
    sin = angles.sin()[:, None, :].to(x1.dtype)
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1).to(h.dtype)


class PatchEmbed(nn.Module):
    def __init__(self, patch_size: int, dim: int):
        super().__init__()
        self.proj = nn.Linear(3 * patch_size * patch_size, dim)

    def forward(self, patches: torch.Tensor) -> torch.Tensor:
        """[N, 3, P, P] -> [N, C]; each patch flattened channel-major (c, dy, dx)."""
        return self.proj(patches.flatten(1).to(self.proj.weight.dtype))


class VisionAttention(nn.Module):
    def __init__(self, dim: int, n_heads: int):
        super().__init__()
        self.n_heads, self.head_dim = n_heads, dim // n_heads
        self.wqkv = nn.Linear(dim, 3 * dim)  # fused q, k, v
        self.wo = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor, angles: torch.Tensor) -> torch.Tensor:
        """x [N, C], angles [N, head_dim / 2] -> [N, C]; every patch attends to every patch."""
        n = x.shape[0]
        q, k, v = self.wqkv(x).view(n, 3, self.n_heads, self.head_dim).unbind(1)  # [N, H, hd] each
        q, k = rotate_half(q, angles), rotate_half(k, angles)
        out = F.scaled_dot_product_attention(
            q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1), scale=self.head_dim**-0.5
        )  # [H, N, hd]
        return self.wo(out.transpose(0, 1).reshape(n, -1))


class VisionMLP(nn.Module):
    def __init__(self, dim: int, inter: int):
        super().__init__()
        self.w1 = nn.Linear(dim, 2 * inter, bias=False)  # gate (first half) and up, fused
        self.w2 = nn.Linear(inter, dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.w1(x).chunk(2, dim=-1)
        return self.w2(F.silu(gate) * up)


class VisionBlock(nn.Module):
    def __init__(self, config: VisionConfig):
        super().__init__()
        c = config.hidden_size
        self.norm1 = RMSNorm(c, VISION_NORM_EPS)
        self.attn = VisionAttention(c, config.num_attention_heads)
        self.norm2 = RMSNorm(c, VISION_NORM_EPS)
        self.mlp = VisionMLP(c, config.intermediate_size)

    def forward(self, x: torch.Tensor, angles: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.norm1(x), angles)
        return x + self.mlp(self.norm2(x))


class VisionTransformer(nn.Module):
    """`vision.*`: patches [N, 3, P, P] -> features [N, C]."""

    def __init__(self, config: VisionConfig):
        super().__init__()
        c, heads = config.hidden_size, config.num_attention_heads
        if c % heads or (c // heads) % 4:
            raise Ds41Error(
                f"vision_config: hidden_size / num_attention_heads must be a multiple of 4 for 2-D "
                f"RoPE, got {c} / {heads}"
            )
        self.patch_size = config.patch_size
        self.rope_dim = c // heads // 2  # angles per head: half for rows, half for columns
        self.theta = config.rope_theta
        self.patch_embed = PatchEmbed(config.patch_size, c)
        self.blocks = nn.ModuleList(VisionBlock(config) for _ in range(config.num_hidden_layers))
        self.norm = RMSNorm(c, VISION_NORM_EPS)

    def forward(self, patches: torch.Tensor, n_vit_h: int, n_vit_w: int) -> torch.Tensor:
        expected = (n_vit_h * n_vit_w, 3, self.patch_size, self.patch_size)
        if tuple(patches.shape) != expected:
            raise Ds41Error(
                f"vision tower: expected patches of shape {expected} for a {n_vit_h}x{n_vit_w} grid, "
                f"got {tuple(patches.shape)}"
            )
        freqs = rope_frequencies(self.rope_dim, self.theta)  # rope_dim / 2 frequencies
        angles = vision_rope_angles(n_vit_h, n_vit_w, freqs).to(patches.device)  # [N, rope_dim]
        x = self.patch_embed(patches)
        for block in self.blocks:
            x = block(x, angles)
        return self.norm(x)


def merge_cells(x: torch.Tensor, ratio: int) -> torch.Tensor:
    """[h, w, C] -> [ceil(h/r), ceil(w/r), C * r * r]: zero-pad bottom/right, then each r x r
    cell as one vector ordered (channel, dy, dx) — PyTorch `unfold`'s order."""
    h, w, c = x.shape
    x = F.pad(x, (0, 0, 0, -w % ratio, 0, -h % ratio))  # pads dims from the last: C, w, h
    n_h, n_w = x.shape[0] // ratio, x.shape[1] // ratio
    cells = x.view(n_h, ratio, n_w, ratio, c).permute(0, 2, 4, 1, 3)  # [n_h, n_w, C, dy, dx]
    return cells.reshape(n_h, n_w, c * ratio * ratio)


class Aligner(nn.Module):
    """`aligner.*`: 3x3 cells of ViT features -> LM embeddings [n_h, n_w, D]."""

    def __init__(self, config: VisionConfig, lm_dim: int):
        super().__init__()
        self.ratio = config.downsample_ratio
        self.w1 = nn.Linear(config.hidden_size * self.ratio**2, lm_dim)
        self.w2 = nn.Linear(lm_dim, lm_dim)

    def forward(self, features: torch.Tensor, n_vit_h: int, n_vit_w: int) -> torch.Tensor:
        cells = merge_cells(features.view(n_vit_h, n_vit_w, -1), self.ratio)
        hidden = F.gelu(upcast(self.w1(cells))).to(cells.dtype)  # exact (erf) GELU
        return self.w2(hidden)


def place_image(
    cells: torch.Tensor, start: torch.Tensor, newline: torch.Tensor, end: torch.Tensor
) -> torch.Tensor:
    """Aligner output [n_h, n_w, D] -> span embeddings [n_h * (n_w + 1) + 2, D] (§7.3):
    START, each row of cells followed by NEWLINE, END."""
    n_h, _, d = cells.shape
    rows = torch.cat([cells, newline.to(cells.dtype).expand(n_h, 1, d)], dim=1).flatten(0, 1)
    return torch.cat([start.to(cells.dtype)[None], rows, end.to(cells.dtype)[None]])


class VisionTower(nn.Module):
    """Everything between an image's patches and its span of LM input embeddings."""

    def __init__(self, config: VisionConfig, lm_dim: int):
        super().__init__()
        self.config = config
        self.vision = VisionTransformer(config)
        self.aligner = Aligner(config, lm_dim)
        self.image_start = nn.Parameter(torch.zeros(lm_dim))
        self.image_newline = nn.Parameter(torch.zeros(lm_dim))
        self.image_end = nn.Parameter(torch.zeros(lm_dim))

    @property
    def dtype(self) -> torch.dtype:
        return self.image_start.dtype

    def cells(self, patches: torch.Tensor, n_vit_h: int, n_vit_w: int) -> torch.Tensor:
        """patches [n_vit_h * n_vit_w, 3, P, P] -> aligner output [n_h, n_w, D]."""
        return self.aligner(self.vision(patches, n_vit_h, n_vit_w), n_vit_h, n_vit_w)

    @torch.no_grad()
    def forward(self, patches: torch.Tensor, n_vit_h: int, n_vit_w: int) -> torch.Tensor:
        """patches -> the image's span embeddings [n_h * (n_w + 1) + 2, D]."""
        cells = self.cells(patches, n_vit_h, n_vit_w)
        return place_image(cells, self.image_start, self.image_newline, self.image_end)
