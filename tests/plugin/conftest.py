"""Upstream SGLang's own Engram layer with our plugin loaded the way SGLang loads it.

`load_plugins()` runs the installed entry points (ours among them) and applies the hooks;
the layer is then built by upstream's code from a tiny checkpoint's config, under the
runtime context (model path, TP size and rank) that SGLang publishes in a server process.
"""

from __future__ import annotations

import pytest


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
