"""`fast.jit.host_empty`: the tensor a compiled loop fills through its numpy array."""

from __future__ import annotations

import pytest
import torch

from sglang_ds41.fast.jit import HOST_ELEMENTS, host_empty

DTYPES = [torch.float32, torch.float64, torch.int64, torch.int32, torch.uint8, torch.bool]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(3, 5), (0, 4), (2, 0, 3), (7,), (HOST_ELEMENTS + 1,), (300, 64)])
def test_the_array_is_the_tensors_memory(dtype, shape):
    tensor, array = host_empty(*shape, dtype=dtype)
    assert tensor.dtype == dtype and tuple(tensor.shape) == shape and tensor.is_contiguous()
    array[...] = 1
    assert bool((tensor == 1).all())
    tensor.zero_()
    assert not array.any()
    if tensor.numel() > HOST_ELEMENTS:  # a prefill's: aligned for its GEMMs as torch aligns
        assert tensor.data_ptr() % 64 == 0
