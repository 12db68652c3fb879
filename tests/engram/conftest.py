"""Shared Engram test fixtures: the §11 TINY hasher and the official layout."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from sglang_ds41.config import V41Config
from sglang_ds41.engram.hashing import EngramHasher

FIXTURES = Path(__file__).parent.parent / "fixtures"
TINY_CONFIG = FIXTURES / "tiny_config.json"
OFFICIAL_CONFIG = FIXTURES / "official_config.json"


@pytest.fixture(scope="session")
def tiny_config() -> V41Config:
    return V41Config.from_file(TINY_CONFIG)


@pytest.fixture(scope="session")
def official_config() -> V41Config:
    return V41Config.from_file(OFFICIAL_CONFIG)


@pytest.fixture(scope="session")
def engram_cache_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A token-map cache that holds the real tokenizer's map, built once per session."""
    from sglang_ds41.assets import TOKENIZER_JSON
    from sglang_ds41.engram.token_map import load_token_map

    cache_dir = tmp_path_factory.mktemp("engram-cache")
    load_token_map(TOKENIZER_JSON, cache_dir=cache_dir)
    return cache_dir


@pytest.fixture(scope="session")
def tiny_hasher(tiny_config: V41Config) -> EngramHasher:
    # MODEL.md §11: the tokenizer-free test map is id // 2 (256 compressed ids, pad = 1).
    return EngramHasher.from_config(tiny_config, torch.arange(512) // 2)
