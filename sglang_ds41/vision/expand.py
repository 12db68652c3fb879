"""Prompt ids with one placeholder per image -> the ids, mask and input embeddings the LM
consumes (MODEL.md §7.3, ENCODING.md §2.9).

The renderer leaves one `image_token_id` per image; the model needs `n_h * (n_w + 1) + 2`
positions per image, all carrying that id, whose input embeddings come from the vision tower.
`expand_image_ids` is the id arithmetic alone (what a server's multimodal processor does to a
prompt before scheduling); `build_image_prompt` adds the embeddings for the reference model.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from sglang_ds41.errors import Ds41Error
from sglang_ds41.model.vision import VisionTower

from .preprocess import PreprocessedImage


@dataclass(frozen=True)
class ImagePrompt:
    """A prompt with its image spans expanded."""

    input_ids: torch.Tensor  # [T] int64; every image position holds image_token_id
    is_image: torch.Tensor  # [T] bool
    image_embeds: torch.Tensor  # [is_image.sum(), D]: the spans' embeddings, in prompt order
    spans: tuple[tuple[int, int], ...]  # (first position, length) of each image


def expand_image_ids(
    ids: Sequence[int], token_counts: Sequence[int], image_token_id: int
) -> tuple[list[int], list[tuple[int, int]]]:
    """Replace the k placeholders of `ids` by runs of `token_counts[i]` image ids.

    Returns the expanded ids and each image's (first position, length)."""
    placeholders = [i for i, t in enumerate(ids) if t == image_token_id]
    if len(placeholders) != len(token_counts):
        raise Ds41Error(
            f"the prompt has {len(placeholders)} image placeholders (id {image_token_id}) but "
            f"{len(token_counts)} images were given"
        )
    out: list[int] = []
    spans: list[tuple[int, int]] = []
    prev = 0
    for at, count in zip(placeholders, token_counts, strict=True):
        if count < 1:
            raise Ds41Error(f"an image must take at least one position, got {count}")
        out.extend(ids[prev:at])
        spans.append((len(out), count))
        out.extend([image_token_id] * count)
        prev = at + 1
    out.extend(ids[prev:])
    return out, spans


def build_image_prompt(
    ids: Sequence[int], images: Sequence[PreprocessedImage], tower: VisionTower, image_token_id: int
) -> ImagePrompt:
    """Expanded ids, image mask and image embeddings (the tower's dtype) of a rendered prompt."""
    expanded, spans = expand_image_ids(ids, [im.token_count for im in images], image_token_id)
    embeds = [tower(im.patches, im.grid.n_vit_h, im.grid.n_vit_w) for im in images]
    for (_, length), e in zip(spans, embeds, strict=True):
        if e.shape[0] != length:  # the tower's grid must agree with the preprocessing grid
            raise Ds41Error(
                f"vision tower produced {e.shape[0]} span rows for an image of {length} positions"
            )
    input_ids = torch.tensor(expanded, dtype=torch.int64)
    d = tower.image_start.shape[0]
    image_embeds = torch.cat(embeds) if embeds else torch.empty(0, d, dtype=tower.dtype)
    return ImagePrompt(input_ids, input_ids == image_token_id, image_embeds, tuple(spans))
