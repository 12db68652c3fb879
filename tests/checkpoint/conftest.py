"""Tiny checkpoints built once per test session (each variant only when a test asks for it)."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import pytest

from sglang_ds41.checkpoint.tiny import write_tiny


@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory) -> Callable[..., Path]:
    """`tiny_dir(variant, engram)` -> a read-only-by-convention tiny checkpoint (seed 0)."""
    built: dict[tuple[str, str], Path] = {}

    def get(variant: str = "base", engram: str = "fp8") -> Path:
        key = (variant, engram)
        if key not in built:
            built[key] = write_tiny(
                tmp_path_factory.mktemp(f"tiny-{variant}-{engram}"), variant, engram, seed=0
            )
        return built[key]

    return get


@pytest.fixture
def clone(tmp_path) -> Callable[[Path], Path]:
    """A cheap writable copy: every file a symlink, so a test replaces only what it corrupts."""

    def make(src: Path) -> Path:
        dst = tmp_path / "ckpt"
        dst.mkdir()
        for f in src.iterdir():
            os.symlink(f, dst / f.name)
        return dst

    return make
