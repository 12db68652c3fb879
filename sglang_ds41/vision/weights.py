"""Build the `VisionTower` from a checkpoint directory through the shared loader (MODEL.md §8.6).

The tower's parameter names are the checkpoint's (`vision.*`, `aligner.*`, `image_start`,
`image_newline`, `image_end`), so loading is a name-for-name copy through the shared loader
(`checkpoint.load`); afterwards every vision tensor of the manifest must have been used, so a
naming mistake fails loudly.
"""

from __future__ import annotations

from pathlib import Path

import torch

from sglang_ds41.checkpoint.load import fill_dense_parameters, require_all_used
from sglang_ds41.checkpoint.manifest import VISION
from sglang_ds41.checkpoint.reader import Checkpoint, CheckpointError
from sglang_ds41.model.vision import VisionTower

PLACEMENT = ("image_start", "image_newline", "image_end")


def load_vision_tower(model_dir: str | Path, dtype: torch.dtype = torch.float32) -> VisionTower:
    """The vision tower of a checkpoint directory (validated first), weights cast to `dtype`."""
    ckpt = Checkpoint.open(model_dir)
    try:
        return vision_tower_from(ckpt, dtype)
    finally:
        ckpt.close()


def _same_name(param: str) -> str:
    return param


def vision_tower_from(ckpt: Checkpoint, dtype: torch.dtype = torch.float32) -> VisionTower:
    config = ckpt.config
    if config.vision is None:
        raise CheckpointError(f"{ckpt.root}: config.json has no vision_config (a text-only checkpoint)")
    tower = VisionTower(config.vision, config.text.hidden_size)
    used = fill_dense_parameters(ckpt, tower.named_parameters(), _same_name, dtype, "the vision tower")
    expected = {s.name for s in ckpt.manifest if s.group == VISION} | set(PLACEMENT)
    require_all_used(ckpt, used, "the vision tower", expected, kind="vision")
    return tower.requires_grad_(False).eval()
