import math

import torch

from sglang_ds41.model.norm import RMSNorm, upcast


def test_rmsnorm_matches_hand_computation():
    norm = RMSNorm(2, eps=1e-20)
    with torch.no_grad():
        norm.weight.copy_(torch.tensor([2.0, 0.5]))
    x = torch.tensor([[3.0, 4.0]], dtype=torch.float64)
    rms = math.sqrt((9 + 16) / 2)
    expected = torch.tensor([[2 * 3 / rms, 0.5 * 4 / rms]], dtype=torch.float64)
    assert torch.allclose(norm.to(torch.float64)(x), expected, rtol=1e-15, atol=0)


def test_rmsnorm_of_zero_vector_is_zero_with_tiny_eps():
    assert torch.equal(RMSNorm(4, eps=1e-20)(torch.zeros(1, 4)), torch.zeros(1, 4))


def test_bf16_input_is_normalised_in_float32_and_returned_in_bf16():
    x = torch.tensor([[1.0, 2.0, 3.0, 4.0]], dtype=torch.bfloat16)
    y = RMSNorm(4, eps=1e-20)(x)
    assert y.dtype == torch.bfloat16
    assert upcast(x).dtype == torch.float32
    assert upcast(x.double()).dtype == torch.float64
