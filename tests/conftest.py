"""Fixtures shared by every test folder."""

from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from sglang_ds41.checkpoint.tiny import write_tiny


@pytest.fixture
def one_torch_thread():
    """Tests made of many tiny ops run ~10x faster on one thread on the shared 2-core CI box."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="session")
def tiny_ckpt(tmp_path_factory) -> Callable[..., Path]:
    """`tiny_ckpt(variant, engram)` -> a tiny checkpoint directory (seed 0), written once per run."""
    built: dict[tuple[str, str], Path] = {}

    def get(variant: str = "base", engram: str = "fp8") -> Path:
        if (variant, engram) not in built:
            out = tmp_path_factory.mktemp(f"tiny-{variant}-{engram}")
            built[variant, engram] = write_tiny(out, variant, engram, seed=0)
        return built[variant, engram]

    return get


@pytest.fixture(scope="session")
def ckpt(tiny_ckpt) -> Path:
    """The base checkpoint with FP8 Engram tables; tests only read it."""
    return tiny_ckpt()
