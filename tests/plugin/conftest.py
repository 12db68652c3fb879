"""Upstream SGLang's own Engram layer with our plugin loaded the way SGLang loads it.

`load_plugins()` runs the installed entry points (ours among them) and applies the hooks;
the layer is then built by upstream's code from a tiny checkpoint's config, under the
runtime context (model path, TP size and rank) that SGLang publishes in a server process.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from sglang_ds41.checkpoint.tiny import write_tiny


@pytest.fixture(autouse=True)
def _one_thread(one_torch_thread):
    """Tiny tensors: one thread (see tests/conftest.py)."""


@pytest.fixture(scope="session")
def upstream_engram():
    """`sglang.srt.layers.engram` after `sglang.srt.plugins.load_plugins()`."""
    from sglang.srt.plugins import load_plugins

    load_plugins()
    from sglang.srt.layers import engram

    return engram


@pytest.fixture(scope="session")
def tiny_ckpt(tmp_path_factory) -> Callable[[str], Path]:
    """`tiny_ckpt(engram)` -> a tiny checkpoint (base variant, seed 0), written once per format."""
    built: dict[str, Path] = {}

    def get(engram: str = "mxfp4") -> Path:
        if engram not in built:
            built[engram] = write_tiny(tmp_path_factory.mktemp(f"tiny-{engram}"), "base", engram, seed=0)
        return built[engram]

    return get
