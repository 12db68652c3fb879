import pytest


@pytest.fixture(autouse=True)
def _one_thread(one_torch_thread):
    """Many tiny ops: one thread (see tests/conftest.py)."""
