"""Images inside SGLang: the processor's spans -> the tower's embeddings at image positions.

SGLang's V4.1 processor (`srt/multimodal/processors/deepseek_v41.py`, mapped to our
architecture by `serve/launch_hooks.py`) already expands each placeholder into the image's whole span of
`image_token_id` and hands one `MultimodalDataItem` per image: bf16 patches, `n_vit_h`,
`n_vit_w` and the span's offsets. Its preprocessing is bit for bit ours (`vision.preprocess`,
checked in tests/vision), so the server does not register a processor of its own.

What the model adds (MODEL.md §7.3):

* `pad_ids`: the scheduler replaces a span's ids by pad values derived from a hash of the image
  data, so the radix cache keys a cached image span by its pixels, not by the shared image id.
* `image_spans`: each image through the shared `VisionTower` -> its span embeddings, in the
  form SGLang's embedding cache and chunk scheduler expect (one complete span per item).
* `prompt_embeddings`: SGLang's `embed_mm_inputs` picks this chunk's rows of each span (a chunk
  or a radix hit may start or end inside one) and scatters them over the token embeddings.
* `vocab_ids`: the pad values back to `image_token_id`, which is what the slot store's token
  history, Engram (image positions are DEAD) and the router (`bias_vl`) must see.
"""

from __future__ import annotations

from array import array
from collections.abc import Sequence

import torch
from torch import nn

from sglang_ds41.errors import Ds41Error
from sglang_ds41.model.vision import VisionTower


class ImageInputError(Ds41Error):
    """An image item from SGLang's processor does not fit the vision tower."""


def pad_ids(input_ids: array, mm_inputs) -> array:
    """The prompt with each image span's ids replaced by that image's hash-derived pad values."""
    from sglang.srt.managers.mm_utils import pad_mm_tokens

    return pad_mm_tokens(input_ids, mm_inputs)


def image_spans(tower: VisionTower, items: Sequence, device: torch.device) -> list[torch.Tensor]:
    """One span of embeddings [n_h * (n_w + 1) + 2, D] per item (the tower's dtype)."""
    spans = []
    for item in items:
        n_vit_h, n_vit_w = int(item.n_vit_h), int(item.n_vit_w)
        patches = torch.as_tensor(item.feature).to(device)
        span = tower(patches, n_vit_h, n_vit_w)
        want = sum(end - start + 1 for start, end in item.offsets)
        if span.shape[0] != want:
            raise ImageInputError(
                f"image item with a {n_vit_h}x{n_vit_w} patch grid: the vision tower gives "
                f"{span.shape[0]} span rows but the prompt holds {want} image positions for it"
            )
        spans.append(span)
    return spans


def has_images(forward_batch) -> bool:
    """Whether this batch is a prefill chunk of at least one request with images."""
    mm_inputs = getattr(forward_batch, "mm_inputs", None)
    return (
        forward_batch.forward_mode.is_extend()
        and mm_inputs is not None
        and any(mm is not None and mm.mm_items for mm in mm_inputs)
    )


def prompt_embeddings(
    model: nn.Module, input_ids: torch.Tensor, forward_batch, embed: nn.Embedding
) -> torch.Tensor:
    """Input embeddings [T, D] of the batch's new tokens: the token embedding, image positions
    replaced by their rows of the image spans (`model.get_image_feature`)."""
    from sglang.srt.managers.mm_utils import embed_mm_inputs
    from sglang.srt.managers.schedule_batch import MultimodalInputs

    no_images = MultimodalInputs(mm_items=[])
    embeds, _ = embed_mm_inputs(
        mm_inputs_list=[no_images if mm is None else mm for mm in forward_batch.mm_inputs],
        extend_prefix_lens=forward_batch.extend_prefix_lens_cpu,
        extend_seq_lens=forward_batch.extend_seq_lens_cpu,
        input_ids=input_ids.clone(),  # clamped in place; the pad values must survive for us
        input_embedding=embed,
        multimodal_model=model,
    )
    return embeds


def vocab_ids(input_ids: torch.Tensor, image_token_id: int) -> torch.Tensor:
    """SGLang's image pad values (>= MM_PAD_SHIFT_VALUE, above any vocabulary id) -> the image id."""
    from sglang.srt.managers.schedule_batch import MM_PAD_SHIFT_VALUE

    return input_ids.masked_fill(input_ids >= MM_PAD_SHIFT_VALUE, image_token_id)
