"""`model.mhc.sinkhorn` with its gradient, as two compiled loops instead of ~120 autograd ops.

A training step runs the Sinkhorn of 16 hyper-connection sites over every token of the batch
(~6,000): after the softmax, 39 normalisations (20 of the columns, 19 of the rows), each a sum
and a division on [T, 4, 4], and autograd's backward of every one of them. As torch ops that
is ~0.4-0.5 s of a ~3 s step, nearly all of it passes over a
few hundred kilobytes per op. Here the rounds after the softmax run as one loop over the
tokens, and the backward as one more that recomputes each token block's rounds (nothing is
kept but the softmax) and walks them back.

Bit for bit the oracle's: the same float32 operations in the same order — a sum over 4 is
torch's sequential one, each division an IEEE division, the backward of `c / (sum(c) + eps)`
autograd's `g / d` plus the sum of `-g * ((c / d) / d)` over the normalised dimension — so
the trainer's weights do not change (tests/training/test_sinkhorn.py compares values and
gradients with `torch.equal`). The softmax stays torch's (its exp is the oracle's).
"""

from __future__ import annotations

import numpy as np
import torch

from sglang_ds41.fast.jit import compiled, numpy_of
from sglang_ds41.model import mhc

# torch sums up to 4 values in order (x0 + x1 + x2 + x3); more it sums in interleaved partial
# sums, which these loops do not copy: larger matrices take the oracle (V4.1's are 4 x 4).
SEQUENTIAL_SUM = 4
# Tokens per block of the loops: a block's rounds, 2 x iterations x n x n x BLOCK float32
# (164 KB at 20 rounds, n 4), stay in the cache.
BLOCK = 64


def sinkhorn(z: torch.Tensor, iters: int, eps: float) -> torch.Tensor:
    """`model.mhc.sinkhorn(z, iters, eps)` for float32 z [..., n, n] on the CPU, n <= 4
    (anything else: the oracle itself)."""
    n = z.shape[-1]
    square = z.dim() >= 2 and z.shape[-2] == n
    if z.dtype != torch.float32 or z.device.type != "cpu" or iters < 1 or n > SEQUENTIAL_SUM or not square:
        return mhc.sinkhorn(z, iters, eps)
    return _Rounds.apply(torch.softmax(z, dim=-1), iters, eps)


class _Rounds(torch.autograd.Function):
    """softmax [..., n, n] -> the doubly-stochastic rounds (`sinkhorn` after its softmax)."""

    @staticmethod
    def forward(ctx, soft: torch.Tensor, iters: int, eps: float) -> torch.Tensor:
        soft_t = _token_last(soft)  # [n, n, T]
        out = torch.empty_like(soft_t)
        _forward(numpy_of(soft_t), iters, np.float32(eps), numpy_of(out))
        ctx.save_for_backward(soft_t)
        ctx.iters, ctx.eps, ctx.shape = iters, eps, soft.shape
        return _token_first(out, soft.shape)

    @staticmethod
    @torch.autograd.function.once_differentiable  # the loops are not differentiable again
    def backward(ctx, grad: torch.Tensor):
        (soft_t,) = ctx.saved_tensors
        g = _token_last(grad)
        out = torch.empty_like(g)
        _backward(numpy_of(soft_t), numpy_of(g), ctx.iters, np.float32(ctx.eps), numpy_of(out))
        return _token_first(out, ctx.shape), None, None


def _token_last(x: torch.Tensor) -> torch.Tensor:
    """[..., n, n] -> [n, n, T] contiguous float32: the loops run over tokens innermost."""
    n = x.shape[-1]
    return x.reshape(-1, n, n).permute(1, 2, 0).contiguous()


def _token_first(x: torch.Tensor, shape: torch.Size) -> torch.Tensor:
    """[n, n, T] -> `shape` [..., n, n], contiguous as the oracle's result (a strided one would
    slow every op that reads it: the stream's expand einsum took ~3x as long)."""
    return x.permute(2, 0, 1).contiguous().view(shape)


@compiled(ieee_division=True)
def _sums(c, a, rows, tokens, eps, d):
    """d[t] = the sum of c's row (`rows`) or column `a` over its n entries + eps, for t <
    tokens: sequential, as torch sums 4 values. Loops run over t innermost (vectorised)."""
    n = c.shape[0]
    for t in range(tokens):
        d[t] = c[a, 0, t] if rows else c[0, a, t]
    for b in range(1, n):
        x = c[a, b] if rows else c[b, a]
        for t in range(tokens):
            d[t] += x[t]
    for t in range(tokens):
        d[t] += eps


@compiled(ieee_division=True)
def _normalise(c, eps, tokens, rows, d):
    """c[j, k, t] /= (its row's or column's sum + eps) for t < tokens: each row a of c (over
    k) when `rows`, else each column (over j); d[a] keeps the divisors."""
    n = c.shape[0]
    for a in range(n):
        _sums(c, a, rows, tokens, eps, d[a])
        for b in range(n):
            x = c[a, b] if rows else c[b, a]
            for t in range(tokens):
                x[t] = x[t] / d[a, t]


@compiled(ieee_division=True)
def _first(soft, eps, t0, t1, c):
    """c[..., t - t0] = soft[..., t] + eps: the first round's input (the softmax + eps)."""
    n = soft.shape[0]
    for j in range(n):
        for k in range(n):
            for t in range(t0, t1):
                c[j, k, t - t0] = soft[j, k, t] + eps


@compiled(ieee_division=True)
def _rounds(soft, iters, eps, t0, t1, states, d):
    """Tokens [t0, t1)'s rounds: states[0] the softmax + eps, states[i + 1] the output of step
    i (columns, then rows and columns iters - 1 times), d[i] its divisors."""
    _first(soft, eps, t0, t1, states[0])
    for i in range(2 * iters - 1):
        states[i + 1] = states[i]
        _normalise(states[i + 1], eps, t1 - t0, i % 2 == 1, d[i])


@compiled(ieee_division=True)
def _forward(soft, iters, eps, out):
    n, _, tokens = soft.shape
    steps = 2 * iters - 1
    states = np.empty((steps + 1, n, n, BLOCK), np.float32)
    d = np.empty((steps, n, BLOCK), np.float32)
    for t0 in range(0, tokens, BLOCK):
        t1 = min(t0 + BLOCK, tokens)
        _rounds(soft, iters, eps, t0, t1, states, d)
        for j in range(n):
            for k in range(n):
                for t in range(t0, t1):
                    out[j, k, t] = states[steps, j, k, t - t0]


@compiled(ieee_division=True)
def _backward(soft, grad, iters, eps, out):
    """d loss / d soft from d loss / d rounds' output, block by block of tokens: the block's
    rounds recomputed (states[i] the input of step i, d[i] its divisors), then walked back."""
    n, _, tokens = soft.shape
    steps = 2 * iters - 1
    states = np.empty((steps + 1, n, n, BLOCK), np.float32)
    d = np.empty((steps, n, BLOCK), np.float32)
    g = np.empty((n, n, BLOCK), np.float32)
    acc = np.empty(BLOCK, np.float32)
    for t0 in range(0, tokens, BLOCK):
        t1 = min(t0 + BLOCK, tokens)
        count = t1 - t0
        _rounds(soft, iters, eps, t0, t1, states, d)
        for j in range(n):
            for k in range(n):
                for t in range(count):
                    g[j, k, t] = grad[j, k, t0 + t]
        for i in range(steps - 1, -1, -1):
            # out = c / d with d = sum(c) + eps: autograd gives c the gradient g / d from the division
            # and, from the sum, the sum of -g * ((c / d) / d) over the normalised index,
            # where c / d is the step's output, bit for bit.
            quotient = states[i + 1]
            rows = i % 2 == 1
            for a in range(n):
                divisor = d[i, a]
                x = quotient[a, 0] if rows else quotient[0, a]
                y = g[a, 0] if rows else g[0, a]
                for t in range(count):
                    acc[t] = -y[t] * (x[t] / divisor[t])
                for b in range(1, n):
                    x = quotient[a, b] if rows else quotient[b, a]
                    y = g[a, b] if rows else g[b, a]
                    for t in range(count):
                        acc[t] += -y[t] * (x[t] / divisor[t])
                for b in range(n):
                    y = g[a, b] if rows else g[b, a]
                    for t in range(count):
                        y[t] = y[t] / divisor[t] + acc[t]
        for j in range(n):
            for k in range(n):
                for t in range(count):
                    out[j, k, t0 + t] = g[j, k, t]
