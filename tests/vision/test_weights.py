"""The tiny checkpoint's vision tower through the shared reader (MODEL.md §8.6)."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors import safe_open

from sglang_ds41.checkpoint.reader import CheckpointError
from sglang_ds41.vision.weights import load_vision_tower


def stored(tiny_dir, name: str) -> torch.Tensor:
    index = json.loads((tiny_dir / "model.safetensors.index.json").read_text())["weight_map"]
    with safe_open(str(tiny_dir / index[name]), framework="pt") as f:
        return f.get_tensor(name)


def test_every_tower_parameter_is_the_checkpoint_tensor_of_that_name(tiny_dir):
    tower = load_vision_tower(tiny_dir, torch.float32)
    names = dict(tower.named_parameters())
    assert len(names) == 2 + 8 * 1 + 1 + 4 + 3  # patch_embed, one block, norm, aligner, placement
    for name, p in names.items():
        assert torch.equal(p, stored(tiny_dir, name).float()), name
    assert p.dtype == torch.float32 and not p.requires_grad


def test_tower_runs_on_the_tiny_grid(tiny_dir):
    tower = load_vision_tower(tiny_dir, torch.float64)
    span = tower(torch.zeros(36, 3, 2, 2, dtype=torch.float64), 6, 6)  # 12x12 px -> 8 positions
    assert span.shape == (8, 64) and torch.isfinite(span).all()
    assert torch.equal(span[0], stored(tiny_dir, "image_start").double())
    assert torch.equal(span[3], stored(tiny_dir, "image_newline").double())


def test_text_only_checkpoint_has_no_tower(tiny_dir, tmp_path):
    for f in tiny_dir.iterdir():
        (tmp_path / f.name).symlink_to(f)
    config = json.loads((tiny_dir / "config.json").read_text())
    del config["vision_config"]
    (tmp_path / "config.json").unlink()
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(CheckpointError):  # the manifest no longer lists the vision tensors
        load_vision_tower(tmp_path)
