"""Manifold-constrained hyper-connections: the 4-copy residual stream (MODEL.md §3).

The residual is `R [T, hc, D]`. Each sublayer (attention, MoE) is one *site* with its own
`(fn, base, scale)`; the site reads the stream entering it and produces

* `pre  [T, hc]`     weights that collapse the stream into the next sublayer's input,
* `post [T, hc]`     how the sublayer output is spread back over the copies,
* `comb [T, hc, hc]` a doubly-stochastic mix of the copies (row = input copy, column = output).

V4.1 lags `pre` by one site (`hc_pre_from_prev_sublayer`): a sublayer's input is collapsed
with the *previous* site's `pre` (layer 0's attention uses a one-hot on copy 0, the final
head uses the last MoE site's `pre`), while `post`/`comb` are used by the site that made them.
An assembler therefore runs, per sublayer:

    coeffs = site(R)                           # from the stream entering the site
    y = sublayer(norm(collapse(R, pre)))       # pre: handed over from the previous site
    R = expand(R, y, coeffs.post, coeffs.comb)
    pre = coeffs.pre
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import torch
from torch import nn

from sglang_ds41.config import TextConfig

from .norm import rms_scale, upcast


class HcCoeffs(NamedTuple):
    pre: torch.Tensor  # [T, hc]
    post: torch.Tensor  # [T, hc]
    comb: torch.Tensor  # [T, hc, hc], comb[t, j, k]: input copy j -> output copy k


def sinkhorn(z: torch.Tensor, iters: int, eps: float) -> torch.Tensor:
    """Logits [..., n, n] -> a nearly doubly-stochastic matrix; `iters` normalisation rounds,
    the first of which is a row softmax (§3.2 step 7)."""
    c = torch.softmax(z, dim=-1) + eps
    c = c / (c.sum(dim=-2, keepdim=True) + eps)
    for _ in range(iters - 1):
        c = c / (c.sum(dim=-1, keepdim=True) + eps)  # rows
        c = c / (c.sum(dim=-2, keepdim=True) + eps)  # columns
    return c


Sinkhorn = Callable[[torch.Tensor, int, float], torch.Tensor]


class HyperConnection(nn.Module):
    """One site's coefficients; parameters are named like the checkpoint's
    `hc_{attn,ffn}_{fn,base,scale}` (the assembler maps them)."""

    def __init__(self, cfg: TextConfig):
        super().__init__()
        hc = cfg.hc_mult
        self.hc = hc
        self.norm_eps = cfg.rms_norm_eps
        self.hc_eps = cfg.hc_eps
        self.sinkhorn_iters = cfg.hc_sinkhorn_iters
        self.fn = nn.Parameter(torch.zeros((2 + hc) * hc, hc * cfg.hidden_size))
        self.base = nn.Parameter(torch.zeros((2 + hc) * hc))
        self.scale = nn.Parameter(torch.ones(3))

    def forward(self, r: torch.Tensor, normalise: Sinkhorn = sinkhorn) -> HcCoeffs:
        """`normalise`: `sinkhorn` or a function equal to it (the trainer's, with its gradient)."""
        flat = upcast(r).flatten(1)  # [T, hc*D]
        # Unweighted RMS over all hc*D values, applied after the GEMM (same as before it).
        m = (flat @ upcast(self.fn).T) * rms_scale(flat, self.norm_eps)  # [T, (2+hc)*hc]
        base, scale = upcast(self.base), upcast(self.scale)
        return split_mixes(m, base, scale, self.hc, self.sinkhorn_iters, self.hc_eps, normalise)


def split_mixes(
    m: torch.Tensor,
    base: torch.Tensor,
    scale: torch.Tensor,
    hc: int,
    iters: int,
    eps: float,
    normalise: Sinkhorn = sinkhorn,
) -> HcCoeffs:
    """The site's mixes `m [T, (2+hc)*hc]` (pre | post | comb logits, row-major) -> coefficients."""
    pre = torch.sigmoid(m[:, :hc] * scale[0] + base[:hc]) + eps
    post = 2 * torch.sigmoid(m[:, hc : 2 * hc] * scale[1] + base[hc : 2 * hc])
    z = (m[:, 2 * hc :] * scale[2] + base[2 * hc :]).unflatten(-1, (hc, hc))  # [T, hc, hc]
    return HcCoeffs(pre, post, normalise(z, iters, eps))


def first_pre(r: torch.Tensor) -> torch.Tensor:
    """The `pre` before any site has run: one-hot on copy 0, [T, hc]."""
    pre = torch.zeros(r.shape[:2], dtype=upcast(r).dtype, device=r.device)
    pre[:, 0] = 1
    return pre


def collapse(r: torch.Tensor, pre: torch.Tensor) -> torch.Tensor:
    """sum_k pre[k] * R[:, k]: [T, hc, D], [T, hc] -> [T, D] (fp32 math, stream dtype out)."""
    return torch.einsum("tk,tkd->td", upcast(pre), upcast(r)).to(r.dtype)


def expand(r: torch.Tensor, y: torch.Tensor, post: torch.Tensor, comb: torch.Tensor) -> torch.Tensor:
    """R'[t, k] = post[t, k] * y[t] + sum_j comb[t, j, k] * R[t, j]  (comb^T @ R; the sum runs
    over the *input* index): [T, hc, D], [T, D] -> [T, hc, D]."""
    mixed = torch.einsum("tjk,tjd->tkd", upcast(comb), upcast(r))
    return (upcast(post)[..., None] * upcast(y)[:, None] + mixed).to(r.dtype)
