"""The trainer's compiled Sinkhorn against `model.mhc.sinkhorn`: values and gradients equal bit
for bit, so a training run's weights do not depend on which of the two it used."""

from __future__ import annotations

import pytest
import torch

from sglang_ds41.model.mhc import sinkhorn as oracle
from sglang_ds41.training.sinkhorn import BLOCK, sinkhorn


def values_and_gradient(fn, z: torch.Tensor, weights: torch.Tensor, iters: int, eps: float):
    z = z.detach().clone().requires_grad_()
    out = fn(z, iters, eps)
    (out * weights).sum().backward()
    return out.detach(), z.grad


@pytest.mark.parametrize("tokens", [1, 3, BLOCK, BLOCK + 1, 3 * BLOCK - 5])
@pytest.mark.parametrize("spread", [0.5, 4.0, 30.0])
def test_values_and_gradients_are_the_oracles_bit_for_bit(tokens, spread):
    """Logits spread wide make rows of near-zero entries, where eps decides the sums."""
    gen = torch.Generator().manual_seed(tokens)
    z = torch.randn(tokens, 4, 4, generator=gen) * spread
    weights = torch.randn(tokens, 4, 4, generator=gen)
    got, got_grad = values_and_gradient(sinkhorn, z, weights, 20, 1e-6)
    want, want_grad = values_and_gradient(oracle, z, weights, 20, 1e-6)
    assert got.is_contiguous() and got.shape == want.shape
    assert torch.equal(got, want)
    assert torch.equal(got_grad, want_grad)


@pytest.mark.parametrize("iters", [1, 2, 7])
@pytest.mark.parametrize("n", [2, 3, 4, 5])
def test_other_rounds_and_sizes_too(iters, n):
    """Past 4 x 4 torch sums in another order: the oracle runs there."""
    gen = torch.Generator().manual_seed(iters * 10 + n)
    z = torch.randn(2, 37, n, n, generator=gen) * 3
    weights = torch.randn(2, 37, n, n, generator=gen)
    got, got_grad = values_and_gradient(sinkhorn, z, weights, iters, 1e-3)
    want, want_grad = values_and_gradient(oracle, z, weights, iters, 1e-3)
    assert torch.equal(got, want) and torch.equal(got_grad, want_grad)


def test_a_view_of_the_mixes_as_the_site_passes_it():
    """The site hands over a strided slice of its mixes; the gradient flows back into them."""
    gen = torch.Generator().manual_seed(5)
    mixes = torch.randn(100, 24, generator=gen)
    weights = torch.randn(100, 4, 4, generator=gen)
    grads = []
    for fn in (sinkhorn, oracle):
        m = mixes.clone().requires_grad_()
        (fn(m[:, 8:].unflatten(-1, (4, 4)) * 1.5, 20, 1e-6) * weights).sum().backward()
        grads.append(m.grad)
    assert torch.equal(grads[0], grads[1])
    assert grads[0][:, :8].eq(0).all() and grads[0][:, 8:].ne(0).any()


def test_float64_takes_the_oracle():
    z = torch.randn(6, 4, 4, dtype=torch.float64)
    assert torch.equal(sinkhorn(z, 20, 1e-6), oracle(z, 20, 1e-6))


def test_no_tokens():
    z = torch.zeros(0, 4, 4, requires_grad=True)
    out = sinkhorn(z, 20, 1e-6)
    out.sum().backward()
    assert out.shape == (0, 4, 4) and z.grad.shape == (0, 4, 4)
