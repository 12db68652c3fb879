"""Build the reference `Transformer` from a checkpoint directory (MODEL.md §8).

Through the shared loader (`checkpoint.load`): the directory is validated against the manifest,
every parameter is read by its official name (`checkpoint_name`) and dequantised to a dense
tensor, the Engram tables stay quantised in an `EngramTable` each (whole: one rank), and every
language-model tensor of the checkpoint must have been used. The vision tower, aligner and
DSpark stages are not part of the reference model and are left unread (`vision.weights` loads
the tower).
"""

from __future__ import annotations

from pathlib import Path

import torch

from sglang_ds41.checkpoint.load import (
    attach_engram_tables,
    checkpoint_name,
    engram_hasher,
    fill_dense_parameters,
    require_all_used,
)
from sglang_ds41.checkpoint.reader import Checkpoint

from .model import Transformer


def load_reference(
    model_dir: str | Path,
    dtype: torch.dtype = torch.float32,
    token_map_cache: str | Path | None = None,
) -> Transformer:
    """The reference model of a checkpoint directory, weights dequantised to `dtype`.

    Tensors stored as F32 (hc parameters, sinks, router biases) stay float32 in a bfloat16
    model. `token_map_cache`: where the Engram token map is cached (see `engram.token_map`)."""
    ckpt = Checkpoint.open(model_dir)
    try:
        return _load(ckpt, dtype, token_map_cache)
    finally:
        ckpt.close()


def _load(ckpt: Checkpoint, dtype: torch.dtype, token_map_cache: str | Path | None) -> Transformer:
    config = ckpt.config
    model = Transformer(config, engram_hasher(config, ckpt.root, cache_dir=token_map_cache))
    used = fill_dense_parameters(ckpt, model.named_parameters(), checkpoint_name, dtype, "the model")
    used |= attach_engram_tables(ckpt, [model.layers[layer].engram for layer in config.text.engram_layer_ids])
    require_all_used(ckpt, used, "the reference model")
    return model.requires_grad_(False).eval()
