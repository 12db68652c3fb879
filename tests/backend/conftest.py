"""Fixtures of the backend tests: one torch thread, tiny checkpoints written once per session."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from sglang_ds41.checkpoint.tiny import write_tiny


@pytest.fixture(autouse=True)
def _one_thread(one_torch_thread):
    """Many tiny ops: one thread (see tests/conftest.py)."""


@pytest.fixture(scope="session")
def tiny_ckpt(tmp_path_factory) -> Callable[..., Path]:
    """`tiny_ckpt(variant, engram)` -> a tiny checkpoint directory (seed 0), written once."""
    built: dict[tuple[str, str], Path] = {}

    def get(variant: str = "base", engram: str = "fp8") -> Path:
        if (variant, engram) not in built:
            built[variant, engram] = write_tiny(
                tmp_path_factory.mktemp(f"tiny-{variant}-{engram}"), variant, engram, seed=0
            )
        return built[variant, engram]

    return get


@pytest.fixture(scope="session")
def ckpt(tiny_ckpt) -> Path:
    """The base checkpoint with FP8 Engram tables; tests only read it."""
    return tiny_ckpt()
