"""The Engram layer's residual update (MODEL.md §5.6), shared by the reference model and the backend.

Given the residual stream `R [T, hc, D]` at the start of an Engram layer and the 24 table rows
looked up for each token (`[T, 24, 256]`, columns in layout order), the layer

    kv    = E @ wkv^T                                   # one key per hc copy + one shared value
    dot_k = <R_k * W_k, key_k> * rsqrt(ms(R_k)) * rsqrt(ms(key_k)) / sqrt(D),   W = q_weight * k_weight
    g_k   = sigmoid(sign(dot_k) * sqrt(max(|dot_k|, 1e-6)))
    R'_k  = R_k + g_k * value                           # image-span rows: R' = R

(`ms` = mean of squares + eps). The projection is separate from the rest (`apply_engram`
takes `kv`) so a backend can run `wkv` with its own FP8 linear and reuse the gate math.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import nn

if TYPE_CHECKING:
    from sglang_ds41.config import TextConfig

GATE_FLOOR = 1e-6  # |dot| floor under the signed square root (§5.6 step 5)


def gate_weight(q_weight: torch.Tensor, k_weight: torch.Tensor) -> torch.Tensor:
    """`W = q_weight * k_weight`, `[hc, D]`, in fp32 (or wider): the two vectors only act as a product."""
    compute = torch.promote_types(q_weight.dtype, torch.float32)
    return q_weight.to(compute) * k_weight.to(compute)


def apply_engram(
    residual: torch.Tensor,
    kv: torch.Tensor,
    weight: torch.Tensor,
    eps: float,
    image_mask: torch.Tensor | None = None,
) -> torch.Tensor:
    """Steps 2-7 of §5.6 from the projected `kv [T, (hc + 1) * D]`; returns the new `[T, hc, D]`.

    Math runs in fp32 (float64 stays float64, for tests) and the result is cast back to
    `residual.dtype`. Rows with `image_mask[t]` true are returned unchanged, bit for bit.
    """
    t, hc, d = residual.shape
    compute = torch.promote_types(residual.dtype, torch.float32)
    r = residual.to(compute)
    key = kv[:, : hc * d].reshape(t, hc, d).to(compute)  # step 2: one key per copy ...
    value = kv[:, hc * d :].to(compute)  # ... and one value shared by all copies

    # step 4: normalised dot per (token, copy) — not jointly over the copies
    dot = (r * weight.to(compute) * key).sum(-1)
    dot = dot * torch.rsqrt(r.square().mean(-1) + eps) * torch.rsqrt(key.square().mean(-1) + eps) * d**-0.5
    # step 5: signed square root, then sigmoid
    gate = torch.sigmoid(dot.sign() * dot.abs().clamp_min(GATE_FLOOR).sqrt())  # [T, hc]
    # step 6: same value into every copy
    updated = (r + gate.unsqueeze(-1) * value.unsqueeze(1)).to(residual.dtype)
    if image_mask is None:
        return updated
    # step 7: image-span rows keep their residual (gate forced to 0)
    return torch.where(image_mask.view(t, 1, 1), residual, updated)


class EngramGate(nn.Module):
    """The Engram layer's own weights: `wkv` (dequantised) and the `q_weight` / `k_weight` gate pair.

    Parameter names follow the checkpoint (`layers.L.engram.wkv.weight`, `.q_weight`,
    `.k_weight`); the table itself lives in `engram/table.py` (host memory, TP-sharded).
    """

    # Steps 2-7 from the projected kv; a backend may set a fast form of the same math.
    apply_gate: Callable[..., torch.Tensor] = staticmethod(apply_engram)

    def __init__(
        self,
        hidden_size: int,
        hc_mult: int,
        n_columns: int,
        head_dim: int,
        eps: float,
        dtype: torch.dtype = torch.bfloat16,
    ):
        super().__init__()
        self.hidden_size, self.hc_mult, self.eps = hidden_size, hc_mult, eps
        self.wkv = nn.Linear(n_columns * head_dim, (hc_mult + 1) * hidden_size, bias=False, dtype=dtype)
        self.q_weight = nn.Parameter(torch.empty(hc_mult, hidden_size, dtype=dtype))
        self.k_weight = nn.Parameter(torch.empty(hc_mult, hidden_size, dtype=dtype))

    @classmethod
    def from_config(cls, text_config: TextConfig, dtype: torch.dtype = torch.bfloat16) -> EngramGate:
        t = text_config
        return cls(
            hidden_size=t.hidden_size,
            hc_mult=t.hc_mult,
            n_columns=(t.engram_max_ngram_size - 1) * t.engram_n_heads,
            head_dim=t.engram_head_dim,
            eps=t.rms_norm_eps,
            dtype=dtype,
        )

    def forward(
        self, residual: torch.Tensor, embeddings: torch.Tensor, image_mask: torch.Tensor | None = None
    ) -> torch.Tensor:
        """`residual [T, hc, D]`, `embeddings [T, n_columns, head_dim]` (looked-up rows) -> `[T, hc, D]`."""
        e = embeddings.reshape(embeddings.shape[0], -1).to(self.wkv.weight.dtype)  # [T, 24 * 256]
        kv = F.linear(e, self.wkv.weight)  # step 1-2: in the weight dtype (bf16 when serving)
        return self.apply_gate(
            residual, kv, gate_weight(self.q_weight, self.k_weight), self.eps, image_mask
        )
