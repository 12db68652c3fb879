"""Random TINY reference models (MODEL.md §11) with no checkpoint: the first exactness oracle."""

from __future__ import annotations

import torch

from sglang_ds41.config import V41Config
from sglang_ds41.engram.hashing import EngramHasher
from sglang_ds41.engram.table import EngramTable
from sglang_ds41.formats import fp8_rows_to_mxfp4, quantize_fp8_rows
from sglang_ds41.reference import Transformer

from ..model._tiny import TINY

IMAGE_ID = TINY["image_token_id"]


def tiny_v41() -> V41Config:
    return V41Config.from_dict(TINY)


def _value(name: str, shape: torch.Size, gen: torch.Generator) -> torch.Tensor:
    """Unit-scale activations everywhere: linears std 1/sqrt(fan_in), norms around 1."""
    noise = torch.randn(shape, generator=gen, dtype=torch.float64)
    if name.endswith("norm.weight"):
        return 1 + 0.1 * noise
    if name.endswith(".scale"):  # hc (pre, post, comb) scales
        return 0.5 + 0.5 * torch.rand(shape, generator=gen, dtype=torch.float64)
    if name.endswith(".base"):
        return 0.5 * noise
    if name.endswith(("gate.bias", "gate.bias_vl")):
        return noise
    if name == "head.weight":
        return noise * 2 / shape[1] ** 0.5
    if name == "embed.weight" or len(shape) == 1 or name.endswith(("q_weight", "k_weight")):
        return noise
    return noise / shape[1] ** 0.5


def random_tiny_model(seed: int = 0, dtype: torch.dtype = torch.float64, engram: str = "fp8") -> Transformer:
    """The §11 TINY model with random weights and random FP8 (or MXFP4) Engram tables."""
    config = tiny_v41()
    t = config.text
    hasher = EngramHasher.from_config(config, torch.arange(t.vocab_size) // 2)  # §11 test map
    model = Transformer(config, hasher)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.data = _value(name, p.shape, gen)
        for i, layer in enumerate(t.engram_layer_ids):
            rows = torch.randn(t.engram_num_embeddings[i], t.engram_head_dim, generator=gen)
            values, scales = quantize_fp8_rows(rows)
            if engram == "mxfp4":
                values, scales = fp8_rows_to_mxfp4(values, scales)
            model.layers[layer].engram.table = EngramTable.from_tensors(
                values, scales, name=f"layers.{layer}.engram.embed", pin=False, head_dim=t.engram_head_dim
            )
    return model.requires_grad_(False).to(dtype)
