"""The compiled Engram gate against `engram.gate.apply_engram`, its oracle."""

from __future__ import annotations

import pytest
import torch

from sglang_ds41.engram.gate import apply_engram
from sglang_ds41.fast import engram as fast

HC, D, EPS = 4, 64, 1e-6


def inputs(tokens: int, dtype: torch.dtype, seed: int = 0) -> tuple[torch.Tensor, ...]:
    gen = torch.Generator().manual_seed(seed)
    residual = torch.randn(tokens, HC, D, generator=gen, dtype=dtype)
    kv = torch.randn(tokens, (HC + 1) * D, generator=gen, dtype=dtype)
    weight = torch.rand(HC, D, generator=gen, dtype=dtype) + 0.5
    return residual, kv, weight


@pytest.mark.parametrize("dtype, tolerance", [(torch.float64, 1e-13), (torch.float32, 1e-6)])
@pytest.mark.parametrize("tokens", [1, 7, 300])
def test_equals_the_oracle_and_keeps_image_rows(dtype, tolerance, tokens):
    residual, kv, weight = inputs(tokens, dtype, seed=tokens)
    image = torch.arange(tokens) % 3 == 1
    got = fast.apply_engram(residual, kv, weight, EPS, image)
    want = apply_engram(residual, kv, weight, EPS, image)
    assert got.dtype == dtype
    assert float((got - want).abs().max() / want.abs().max()) < tolerance
    assert torch.equal(got[image], residual[image])
    for t in (0, tokens - 1):  # a row's bits do not depend on the others
        alone = fast.apply_engram(residual[t : t + 1], kv[t : t + 1], weight, EPS, image[t : t + 1])
        assert torch.equal(alone[0], got[t])


def test_a_zero_dot_gates_at_one_half():
    """Keys of zeros: every copy's dot is 0, whose signed root (of the floored |dot|) keeps
    the sign 0, so the gate is sigmoid(0)."""
    residual, kv, weight = inputs(1, torch.float64)
    kv[:, : HC * D] = 0.0
    got = fast.apply_engram(residual, kv, weight, EPS)
    want = apply_engram(residual, kv, weight, EPS)
    assert torch.allclose(got, residual + 0.5 * kv[:, None, HC * D :], rtol=0, atol=1e-15)
    assert torch.allclose(got, want, rtol=0, atol=1e-15)


def test_mixed_dtypes_bad_shapes_and_gradients_take_the_oracle(monkeypatch):
    def refuse(*args):
        raise AssertionError("the compiled loop ran")

    monkeypatch.setattr(fast, "_gate", refuse)
    residual, kv, weight = inputs(3, torch.float32)
    for args in (
        (residual, kv, weight.double(), EPS),  # mixed dtypes
        (residual.bfloat16(), kv.bfloat16(), weight.bfloat16(), EPS),  # no numpy dtype
        (residual, kv, weight.clone().requires_grad_(), EPS),  # autograd
    ):
        got = fast.apply_engram(*args)
        assert torch.equal(got, apply_engram(*args))
    assert fast.apply_engram(residual, kv, weight.clone().requires_grad_(), EPS).requires_grad
    with pytest.raises(RuntimeError):  # the oracle's own error for a key width that does not fit
        fast.apply_engram(residual, kv[:, :-1], weight, EPS)
