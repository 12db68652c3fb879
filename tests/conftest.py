"""Fixtures shared by every test folder."""

import pytest
import torch


@pytest.fixture
def one_torch_thread():
    """Tests made of many tiny ops run ~10x faster on one thread on the shared 2-core CI box."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
