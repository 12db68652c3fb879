import pytest
import torch


@pytest.fixture(autouse=True)
def _one_thread():
    """These tests run many tiny ops; on the shared 2-core CI box one thread is ~10x faster."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
