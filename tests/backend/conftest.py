"""Fixtures of the backend tests: one torch thread (tiny checkpoints: tests/conftest.py)."""

from __future__ import annotations

import pytest


@pytest.fixture(autouse=True)
def _one_thread(one_torch_thread):
    """Many tiny ops: one thread (see tests/conftest.py)."""
