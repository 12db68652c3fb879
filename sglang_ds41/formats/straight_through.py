"""Straight-through gradients for quantisers (training with the model's own fake-quant in the loop).

A quantiser rounds, so its true derivative is zero almost everywhere. Training uses the
straight-through estimator instead: the forward value is the quantiser's, bit for bit, and the
gradient passes as if the quantiser were the identity. Outside autograd (inference, `no_grad`)
the wrapped function is called directly, at no cost.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import torch


def straight_through(
    quantise: Callable[[torch.Tensor], torch.Tensor],
) -> Callable[[torch.Tensor], torch.Tensor]:
    """`quantise(x)` in the forward, the identity in the backward."""

    class _Function(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x: torch.Tensor) -> torch.Tensor:
            return quantise(x)

        @staticmethod
        def backward(ctx, grad: torch.Tensor) -> torch.Tensor:
            return grad

    @functools.wraps(quantise)
    def wrapped(x: torch.Tensor) -> torch.Tensor:
        if torch.is_grad_enabled() and x.requires_grad:
            return _Function.apply(x)
        return quantise(x)

    return wrapped
