"""Mixture of experts: sqrt-softplus router with bias-steered selection, clamped SwiGLU experts,
one shared expert (MODEL.md §6). Parameter names follow the checkpoint's `layers.L.ffn.*`."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from sglang_ds41.config import TextConfig
from sglang_ds41.errors import Ds41Error

from .norm import upcast

# Literal guard of the weight normalisation (not rms_norm_eps).
ROUTE_NORM_EPS = 1e-20


class Gate(nn.Module):
    """Router: scores s = sqrt(softplus(x @ W^T / temp)); the bias only steers *which* experts
    are picked (`bias_vl` for image tokens), the weights come from the unbiased scores."""

    def __init__(self, cfg: TextConfig):
        super().__init__()
        if cfg.scoring_func != "sqrtsoftplus" or cfg.topk_method != "noaux_tc" or cfg.n_group != 1:
            raise Ds41Error(
                "router: only scoring_func='sqrtsoftplus', topk_method='noaux_tc', n_group=1 (V4.1) "
                f"are supported, got {cfg.scoring_func!r}, {cfg.topk_method!r}, n_group={cfg.n_group}"
            )
        self.topk, self.temp = cfg.num_experts_per_tok, cfg.gate_temp
        self.norm_topk_prob, self.route_scale = cfg.norm_topk_prob, cfg.routed_scaling_factor
        self.weight = nn.Parameter(torch.zeros(cfg.n_routed_experts, cfg.hidden_size))
        self.bias = nn.Parameter(torch.zeros(cfg.n_routed_experts, dtype=torch.float32))
        self.bias_vl = nn.Parameter(torch.zeros(cfg.n_routed_experts, dtype=torch.float32))

    def forward(
        self, x: torch.Tensor, is_image: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """x [T, D], is_image [T] bool -> (weights [T, k] fp32 math, expert ids [T, k])."""
        scores = F.softplus(F.linear(upcast(x), upcast(self.weight)) / self.temp).sqrt()  # [T, E]
        bias = upcast(self.bias).expand_as(scores)
        if is_image is not None:
            bias = torch.where(is_image[:, None], upcast(self.bias_vl), bias)
        ids = (scores + bias).topk(self.topk, dim=-1).indices  # [T, k]
        weights = scores.gather(1, ids)
        if self.norm_topk_prob:
            weights = weights / (weights.sum(dim=-1, keepdim=True) + ROUTE_NORM_EPS)
        return weights * self.route_scale, ids


class Expert(nn.Module):
    """SwiGLU with V4.1's clamps: gate branch from above only, up branch on both sides."""

    def __init__(self, dim: int, inter_dim: int, limit: float):
        super().__init__()
        self.limit = limit
        self.w1 = nn.Linear(dim, inter_dim, bias=False)  # gate
        self.w2 = nn.Linear(inter_dim, dim, bias=False)  # down
        self.w3 = nn.Linear(dim, inter_dim, bias=False)  # up

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate = upcast(self.w1(x)).clamp(max=self.limit)  # [T, I]
        up = upcast(self.w3(x)).clamp(-self.limit, self.limit)  # [T, I]
        return self.w2((F.silu(gate) * up).to(x.dtype))  # [T, D]


class MoE(nn.Module):
    def __init__(self, cfg: TextConfig):
        super().__init__()
        d, inter, limit = cfg.hidden_size, cfg.moe_intermediate_size, cfg.swiglu_limit
        self.gate = Gate(cfg)
        self.experts = nn.ModuleList(Expert(d, inter, limit) for _ in range(cfg.n_routed_experts))
        self.shared_experts = Expert(d, inter * cfg.n_shared_experts, limit)

    def forward(self, x: torch.Tensor, is_image: torch.Tensor | None = None) -> torch.Tensor:
        """x [T, D] (normed collapse), is_image [T] -> [T, D]."""
        weights, ids = self.gate(x, is_image)  # [T, k], [T, k]
        y = upcast(self.shared_experts(x))  # [T, D]
        for e in ids.unique().tolist():
            rows, slot = torch.where(ids == e)
            y[rows] += weights[rows, slot, None] * upcast(self.experts[e](x[rows]))
        return y.to(x.dtype)
