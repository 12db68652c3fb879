"""The output head over its nonzero rows against the whole GEMM, and SGLang taking it."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from sglang_ds41.fast import head as fast

VOCAB, HIDDEN = 5000, 48


def make_head(zero_share: float, dtype: torch.dtype = torch.float32, seed: int = 0) -> nn.Linear:
    gen = torch.Generator().manual_seed(seed)
    layer = nn.Linear(HIDDEN, VOCAB, bias=False, dtype=dtype).requires_grad_(False)
    layer.weight.copy_(torch.randn(VOCAB, HIDDEN, generator=gen, dtype=dtype))
    layer.weight[torch.rand(VOCAB, generator=gen) < zero_share] = 0
    return layer


def hidden(tokens: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    return torch.randn(tokens, HIDDEN, generator=torch.Generator().manual_seed(tokens), dtype=dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
@pytest.mark.parametrize("tokens", [1, 7])
def test_mostly_zero_head_gives_the_whole_gemms_logits(dtype, tokens):
    layer, h = make_head(0.8, dtype), hidden(tokens, dtype)
    want = F.linear(h.double() if dtype == torch.float64 else h.float(), layer.weight.to(want_dtype(dtype)))
    got = fast.logits(layer, h)
    assert got.dtype == want_dtype(dtype) and got.shape == (tokens, VOCAB)
    zero = layer.weight.eq(0).all(dim=1)
    assert torch.equal(got[:, zero], torch.zeros_like(got[:, zero]))  # exactly 0, as the GEMM gives
    tolerance = 1e-12 if dtype == torch.float64 else 1e-5
    assert float((got - want).abs().max() / want.abs().max()) < tolerance


def want_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.float64 if dtype == torch.float64 else torch.float32


def test_a_head_with_few_zero_rows_is_the_whole_gemm_bit_for_bit():
    layer, h = make_head(0.1), hidden(3)
    assert torch.equal(fast.logits(layer, h), F.linear(h, layer.weight))


def test_a_weight_changed_in_place_is_seen():
    """Weights updated in place (SGLang's update_weights_from_disk) must not leave a stale copy."""
    layer, h = make_head(0.8), hidden(2)
    fast.logits(layer, h)
    zero = layer.weight.eq(0).all(dim=1)
    row, other = int(zero.nonzero()[0]), int((~zero).nonzero()[-1])
    layer.weight[row] = 1.0
    layer.weight[other] *= 2
    got = fast.logits(layer, h)
    assert torch.allclose(got[:, row], h.sum(dim=1), rtol=1e-5)
    assert torch.allclose(got, F.linear(h, layer.weight), rtol=1e-5, atol=1e-5)


def test_sglang_logits_processor_takes_the_head_through_its_quant_method():
    from sglang.srt.layers.logits_processor import should_apply_lm_head_quant_method

    layer = make_head(0.8)
    wrapped = fast.SglangHead(layer)
    assert wrapped.weight is layer.weight
    assert should_apply_lm_head_quant_method(wrapped, wrapped.quant_method)
    h = hidden(4)
    assert torch.equal(wrapped.quant_method.apply(wrapped, h, None), fast.logits(layer, h))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("tokens", [1, 2, 5, fast.FEW_ROWS, fast.FEW_ROWS + 1])
def test_a_few_rows_of_a_wide_hidden_size_give_the_plain_products(dtype, tokens):
    """At hidden 128 a decode step's rows go through W h^T (one row padded to two): the same
    logits as h W^T within rounding, contiguous, for a whole head and a mostly zero one."""
    gen = torch.Generator().manual_seed(tokens)
    weight = torch.randn(3000, fast.WIDE_HIDDEN, generator=gen, dtype=dtype)
    h = torch.randn(tokens, fast.WIDE_HIDDEN, generator=gen, dtype=dtype)
    got = fast.product(h, weight)
    want = F.linear(h, weight)
    assert got.shape == want.shape and got.is_contiguous()
    tolerance = 1e-12 if dtype == torch.float64 else 1e-5
    assert float((got - want).abs().max() / want.abs().max()) < tolerance
    layer = nn.Linear(fast.WIDE_HIDDEN, 3000, bias=False, dtype=dtype).requires_grad_(False)
    layer.weight.copy_(weight)
    layer.weight[torch.rand(3000, generator=gen) < 0.8] = 0
    got = fast.logits(layer, h)
    want = F.linear(h, layer.weight)
    assert float((got - want).abs().max() / want.abs().max()) < tolerance


def bf16_valued_head(zero_share: float, vocab: int = 5003, width: int = 72) -> nn.Linear:
    """A float32 head of BF16 values, as the backend loads every checkpoint's (odd sizes: rows
    not a multiple of the loop's four, a width not one of the vector's)."""
    gen = torch.Generator().manual_seed(vocab)
    layer = nn.Linear(width, vocab, bias=False).requires_grad_(False)
    layer.weight.copy_(torch.randn(vocab, width, generator=gen).bfloat16().float())
    layer.weight[torch.rand(vocab, generator=gen) < zero_share] = 0
    return layer


@pytest.mark.parametrize("zero_share", [0.0, 0.8])
@pytest.mark.parametrize("tokens", [1, 3, fast.KERNEL_ROWS, fast.KERNEL_ROWS + 1])
def test_a_head_of_bf16_values_gives_the_gemms_logits(zero_share, tokens):
    layer = bf16_valued_head(zero_share)
    h = torch.randn(tokens, layer.weight.shape[1], generator=torch.Generator().manual_seed(tokens))
    got = fast.logits(layer, h)
    want = F.linear(h.double(), layer.weight.double())
    assert got.dtype == torch.float32 and got.shape == want.shape
    assert float((got - want).abs().max() / want.abs().max()) < 1e-6
    zero = layer.weight.eq(0).all(dim=1)
    assert torch.equal(got[:, zero], torch.zeros_like(got[:, zero]))


def test_a_requests_logits_do_not_depend_on_its_batch():
    """The compiled loop sums each logit alone: a row computed with 31 others gives the bits it
    gives by itself (BLAS makes no such promise)."""
    layer = bf16_valued_head(0.5)
    h = torch.randn(fast.KERNEL_ROWS, layer.weight.shape[1], generator=torch.Generator().manual_seed(1))
    batch = fast.logits(layer, h)
    for t in (0, 5, fast.KERNEL_ROWS - 1):
        assert torch.equal(fast.logits(layer, h[t : t + 1]), batch[t : t + 1])


def test_a_bf16_valued_weight_changed_in_place_is_seen():
    layer = bf16_valued_head(0.8)
    h = torch.randn(2, layer.weight.shape[1], generator=torch.Generator().manual_seed(2))
    fast.logits(layer, h)
    zero = layer.weight.eq(0).all(dim=1)
    row = int(zero.nonzero()[0])
    layer.weight[row] = 1.0
    layer.weight[int((~zero).nonzero()[-1])] *= 2
    assert torch.allclose(fast.logits(layer, h), F.linear(h, layer.weight), rtol=1e-5, atol=1e-5)
    layer.weight[row, 0] = 1.0 + 2**-20  # no longer a BF16 value: the plain path takes it
    assert torch.allclose(fast.logits(layer, h), F.linear(h, layer.weight), rtol=1e-5, atol=1e-5)


def test_no_rows_and_a_strided_hidden_state():
    layer = bf16_valued_head(0.5)
    assert fast.logits(layer, torch.zeros(0, layer.weight.shape[1])).shape == (0, layer.weight.shape[0])
    wide = torch.randn(3, 2 * layer.weight.shape[1], generator=torch.Generator().manual_seed(3))
    h = wide[:, ::2]  # every other column: not contiguous
    assert torch.equal(fast.logits(layer, h), fast.logits(layer, h.contiguous()))
