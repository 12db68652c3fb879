"""Initial values of a model trained from scratch (reproducible from one torch.Generator).

Linears get std 1/sqrt(fan_in), so every projection keeps unit scale; the projections that
write into the residual stream (attention `wo_b`, expert and shared-expert `w2`, Engram `wkv`)
are scaled down by sqrt(2 * layers) so the stream grows slowly with depth. Norm weights, the
Engram gate's q/k vectors and the mHC scales are 1, biases and sinks 0; the mHC `fn` is small,
so every site starts near `pre` = 1/2, `post` = 1 and a uniform `comb` (the four copies mixed
evenly, like a plain residual) and learns its own mixes. The tied embedding is not set here:
its rows are given values when their ids first appear (`vocab.VocabRows`).
"""

from __future__ import annotations

import math

import torch

from sglang_ds41.reference.model import Transformer

_OUTPUTS = ("attn.wo_b.weight", "w2.weight", "engram.wkv.weight")
HC_FN_STD = 0.02


@torch.no_grad()
def initialise(model: Transformer, generator: torch.Generator) -> None:
    depth = math.sqrt(2 * model.text.num_hidden_layers)
    for name, p in model.named_parameters():
        leaf = name.rsplit(".", 1)[-1]
        if name == "embed.weight" or name == "head.weight":
            p.zero_()
        elif leaf in ("fn",):
            p.copy_(torch.randn(p.shape, generator=generator) * HC_FN_STD)
        elif leaf in ("base", "bias", "bias_vl", "attn_sink"):
            p.zero_()
        elif p.ndim == 1 or leaf in ("scale", "q_weight", "k_weight"):
            p.fill_(1.0)
        else:
            std = p.shape[-1] ** -0.5 / (depth if name.endswith(_OUTPUTS) else 1.0)
            p.copy_(torch.randn(p.shape, generator=generator) * std)
