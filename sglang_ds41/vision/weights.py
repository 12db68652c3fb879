"""Build the `VisionTower` from a checkpoint directory through the shared reader (MODEL.md §8.6).

The tower's parameter names are the checkpoint's (`vision.*`, `aligner.*`, `image_start`,
`image_newline`, `image_end`), so loading is a name-for-name copy; afterwards every vision
tensor of the manifest must have been used, so a naming mistake fails loudly.
"""

from __future__ import annotations

from pathlib import Path

import torch

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


def vision_tower_from(ckpt: Checkpoint, dtype: torch.dtype = torch.float32) -> VisionTower:
    config = ckpt.config
    if config.vision is None:
        raise CheckpointError(f"{ckpt.root}: config.json has no vision_config (a text-only checkpoint)")
    tower = VisionTower(config.vision, config.text.hidden_size)
    used: set[str] = set()
    for name, p in tower.named_parameters():
        if name not in ckpt.manifest:
            raise CheckpointError(
                f"{ckpt.root}: vision parameter {name} has no tensor in this checkpoint's layout"
            )
        value = ckpt.dense(name, dtype=dtype)
        if tuple(value.shape) != tuple(p.shape):
            raise CheckpointError(
                f"{ckpt.root}: tensor {name} has shape {list(value.shape)}, the vision tower "
                f"expects {list(p.shape)}"
            )
        p.data = value
        used.add(name)
    expected = {s.name for s in ckpt.manifest if s.group == VISION} | set(PLACEMENT)
    unused = sorted(expected - used)
    if unused:
        raise CheckpointError(
            f"{ckpt.root}: {len(unused)} vision tensors are not used by the tower, e.g. {unused[:5]}"
        )
    return tower.requires_grad_(False).eval()
