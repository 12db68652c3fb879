"""Fixtures: one torch thread, the tiny checkpoint (with its one-block ViT) written once."""

from __future__ import annotations

import io
from pathlib import Path

import pytest

from sglang_ds41.checkpoint.tiny import write_tiny


@pytest.fixture(autouse=True)
def _one_thread(one_torch_thread):
    """Many tiny ops: one thread (see tests/conftest.py)."""


@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory) -> Path:
    return write_tiny(tmp_path_factory.mktemp("tiny-vision"), seed=0)


def encode(image, fmt: str = "PNG", **params) -> bytes:
    """A PIL image as encoded bytes."""
    buf = io.BytesIO()
    image.save(buf, fmt, **params)
    return buf.getvalue()
