import pytest


@pytest.fixture(autouse=True)
def _one_thread(one_torch_thread):
    """These tests run many tiny ops: one thread each (see tests/conftest.py)."""
