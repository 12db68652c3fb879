"""Fixtures: one torch thread, the tiny checkpoint (with its one-block ViT) written once."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
import torch

from sglang_ds41.checkpoint.tiny import write_tiny


@pytest.fixture(autouse=True)
def _one_thread():
    """Many tiny ops: on the shared 2-core CI box one thread is much faster."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory) -> Path:
    return write_tiny(tmp_path_factory.mktemp("tiny-vision"), seed=0)


def encode(image, fmt: str = "PNG", **params) -> bytes:
    """A PIL image as encoded bytes."""
    buf = io.BytesIO()
    image.save(buf, fmt, **params)
    return buf.getvalue()
