"""Fixtures: one torch thread, the reference model of a tiny checkpoint (tests/conftest.py) and the
Engram token-map cache, once per session."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from sglang_ds41.reference import Transformer
from sglang_ds41.reference.weights import load_reference


@pytest.fixture(autouse=True)
def _one_thread(one_torch_thread):
    """Many tiny ops: one thread (see tests/conftest.py)."""


@pytest.fixture(scope="session")
def token_map_cache(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("engram-token-map")


@pytest.fixture(scope="session")
def load(tiny_ckpt, token_map_cache) -> Callable[..., Transformer]:
    """`load(variant, engram, dtype)` -> the reference model of that tiny checkpoint (fresh)."""

    def get(variant: str = "base", engram: str = "fp8", dtype: torch.dtype = torch.float64) -> Transformer:
        return load_reference(tiny_ckpt(variant, engram), dtype, token_map_cache=token_map_cache)

    return get
