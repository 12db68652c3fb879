"""Feeding one request to the reference model in chunks."""

from __future__ import annotations

import torch

from sglang_ds41.reference import Transformer


def feed(
    model: Transformer, ids: torch.Tensor, image_embeds: torch.Tensor | None, chunks: list[int]
) -> torch.Tensor:
    """Logits of `ids` fed as consecutive chunks of the given lengths on one fresh state; each
    chunk gets the image embeddings of its own image positions."""
    assert sum(chunks) == ids.numel()
    state, out, start, used = model.new_state(), [], 0, 0
    for n in chunks:
        part = ids[start : start + n]
        n_image = int((part == model.image_token_id).sum())
        embeds = image_embeds[used : used + n_image] if n_image else None
        out.append(model(part, state, embeds))
        start, used = start + n, used + n_image
    return torch.cat(out)


def rel_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).abs().max() / b.abs().max())
