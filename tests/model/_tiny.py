"""The TINY test configuration of MODEL.md §11 and helpers to give modules random weights."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import torch
from torch import nn

from sglang_ds41.config import TextConfig, V41Config

# The TINY configuration of MODEL.md §11, as written out in tests/fixtures (one copy for all tests).
TINY = json.loads((Path(__file__).parents[1] / "fixtures" / "tiny_config.json").read_text())


def tiny_config(**overrides) -> TextConfig:
    data = copy.deepcopy(TINY)
    data["text_config"].update(overrides)
    return V41Config.from_dict(data).text


def randomize_(module: nn.Module, seed: int, std: float = 0.3) -> nn.Module:
    """float64 and fresh random values for every parameter (norm weights around 1)."""
    gen = torch.Generator().manual_seed(seed)
    module.to(torch.float64)
    with torch.no_grad():
        for name, p in module.named_parameters():
            noise = torch.randn(p.shape, generator=gen, dtype=torch.float64) * std
            p.copy_(1 + noise if name.endswith("norm.weight") else noise)
    return module
