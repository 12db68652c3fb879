"""Rotary position embedding with DeepSeek's YaRN frequency blend (MODEL.md §4.2).

RoPE touches only the trailing `rope_dim` channels of a vector, as interleaved pairs
`(2i, 2i+1)` rotated by `position * f_i`. Window-only layers (ratio 0) use `rope_theta`
without YaRN; compressed layers (ratio 1/2) use `compress_rope_theta` with the YaRN blend, for
the query, the window KV, the compressed latents and the indexer's queries and keys alike.
There is no YaRN attention-magnitude (mscale) factor in V4.1.
"""

from __future__ import annotations

import math

import torch

from sglang_ds41.config import RopeScaling, TextConfig

from .norm import upcast


def yarn_band(rope_dim: int, base: float, scaling: RopeScaling) -> tuple[int, int]:
    """The pair indices (lo, hi) between which the YaRN ramp goes from 0 to 1."""

    def pair_index(rotations: float) -> float:
        # Pair i completes `rotations` turns over the original context when this holds.
        wavelength = scaling.original_max_position_embeddings / (rotations * 2 * math.pi)
        return rope_dim * math.log(wavelength) / (2 * math.log(base))

    lo = max(0, math.floor(pair_index(scaling.beta_fast)))
    hi = min(rope_dim - 1, math.ceil(pair_index(scaling.beta_slow)))
    return lo, hi


def rope_frequencies(rope_dim: int, base: float, scaling: RopeScaling | None = None) -> torch.Tensor:
    """f_i for the rope_dim/2 pairs, float64 [rope_dim // 2]."""
    i = torch.arange(rope_dim // 2, dtype=torch.float64)
    freqs = base ** (-2 * i / rope_dim)
    if scaling is None:
        return freqs
    lo, hi = yarn_band(rope_dim, base, scaling)
    ramp = ((i - lo) / max(hi - lo, 1e-3)).clamp(0, 1)  # 0: keep f_i, 1: divide by factor
    return freqs * (1 - ramp) + freqs / scaling.factor * ramp


class RotaryEmbedding:
    """Rotates the trailing 2*len(freqs) channels; not an nn.Module so `.to(dtype)` never
    rounds the frequency table (angles are formed in float64)."""

    def __init__(self, freqs: torch.Tensor):
        self.freqs = freqs.to(torch.float64)
        self.rope_dim = 2 * freqs.numel()

    @classmethod
    def for_layer(cls, cfg: TextConfig, ratio: int) -> RotaryEmbedding:
        if ratio == 0:
            return cls(rope_frequencies(cfg.qk_rope_head_dim, cfg.rope_theta))
        return cls(rope_frequencies(cfg.qk_rope_head_dim, cfg.compress_rope_theta, cfg.rope_scaling))

    def __call__(self, x: torch.Tensor, positions: torch.Tensor, inverse: bool = False) -> torch.Tensor:
        """x [T, ..., D], positions [T] -> x with channels D-rope_dim.. rotated (by -angle if inverse)."""
        angles = positions.to(torch.float64)[:, None] * self.freqs.to(x.device)  # [T, rope_dim/2]
        angles = angles.view(angles.shape[0], *([1] * (x.dim() - 2)), angles.shape[1])
        cos, sin = angles.cos(), angles.sin()
        if inverse:
            sin = -sin
        rot = upcast(x[..., -self.rope_dim :]).unflatten(-1, (-1, 2))  # [T, ..., rope_dim/2, 2]
        cos, sin = cos.to(rot.dtype), sin.to(rot.dtype)
        even, odd = rot[..., 0], rot[..., 1]
        rotated = torch.stack([even * cos - odd * sin, even * sin + odd * cos], dim=-1).flatten(-2)
        return torch.cat([x[..., : -self.rope_dim], rotated.to(x.dtype)], dim=-1)
