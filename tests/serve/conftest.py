"""Fixtures of the launcher tests: a tiny checkpoint to point `serve` at, written once."""

from __future__ import annotations

from pathlib import Path

import pytest

from sglang_ds41.checkpoint.tiny import write_tiny


@pytest.fixture(scope="session")
def ckpt(tmp_path_factory) -> Path:
    """The base tiny checkpoint with FP8 Engram tables (seed 0); tests only read it."""
    return write_tiny(tmp_path_factory.mktemp("tiny-base-fp8"), "base", "fp8", seed=0)
