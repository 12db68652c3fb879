"""The grouped MoE against `model.moe.MoE`, its oracle."""

from __future__ import annotations

import pytest
import torch

from sglang_ds41.fast import moe as fast
from sglang_ds41.model.moe import MoE
from tests.model._tiny import randomize_, tiny_config


def relative(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).abs().max() / b.abs().max())


@pytest.fixture
def layer():
    cfg = tiny_config(n_routed_experts=8, num_experts_per_tok=3)
    return cfg, randomize_(MoE(cfg), seed=5).requires_grad_(False)


@pytest.mark.parametrize("tokens", [1, 4, fast.LOOP_TOKENS + 1, 97])
def test_float64_equals_the_oracle_with_images_routed_by_bias_vl(layer, tokens):
    cfg, moe = layer
    gen = torch.Generator().manual_seed(tokens)
    x = torch.randn(tokens, cfg.hidden_size, generator=gen, dtype=torch.float64)
    is_image = torch.rand(tokens, generator=gen) < 0.4
    weights, ids = moe.gate(x, is_image)
    got_weights, got_ids = fast.route(moe.gate, x, is_image)
    assert torch.equal(got_ids, ids)
    assert relative(got_weights, weights) < 1e-14
    assert relative(fast.forward(moe, x, is_image), moe(x, is_image)) < 1e-13


@pytest.mark.parametrize("tokens", [1, fast.LOOP_TOKENS, fast.LOOP_TOKENS + 1])  # the loop, then GEMMs
def test_float32_stays_within_float32_rounding(layer, tokens):
    cfg, moe = layer
    moe = moe.float()
    x = torch.randn(tokens, cfg.hidden_size, generator=torch.Generator().manual_seed(0))
    got = fast.forward(moe, x)
    assert got.dtype == torch.float32 and relative(got, moe(x)) < 1e-5


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_the_loop_gives_a_token_the_bits_it_gets_alone(layer, dtype):
    """Up to LOOP_TOKENS tokens run token by token: given its routing, each token's output is
    the same bits in any batch (the router's GEMM makes no such promise)."""
    cfg, moe = layer
    moe = moe.to(dtype)
    stacked = fast.Stacked.of(moe)
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(fast.LOOP_TOKENS, cfg.hidden_size, generator=gen, dtype=dtype)
    weights, ids = fast.route(moe.gate, x, None)

    def run(rows: slice) -> torch.Tensor:
        out = torch.empty_like(x[rows])
        parts = x[rows], weights[rows], ids[rows], stacked.up, stacked.down
        fast._token_by_token(*(t.numpy() for t in parts), stacked.limit, out.numpy())
        return out

    batch = run(slice(None))
    assert relative(batch, moe(x)) < (1e-5 if dtype == torch.float32 else 1e-13)
    for t in range(fast.LOOP_TOKENS):
        assert torch.equal(run(slice(t, t + 1))[0], batch[t]), t


def test_a_decode_batch_takes_the_loop_and_a_prefill_the_grouped_gemms(layer, monkeypatch):
    cfg, moe = layer
    moe = moe.float()
    calls = []
    loop = fast._token_by_token
    monkeypatch.setattr(fast, "_token_by_token", lambda *a: calls.append(a[0].shape[0]) or loop(*a))
    for tokens in (1, fast.LOOP_TOKENS, fast.LOOP_TOKENS + 1):
        fast.forward(moe, torch.randn(tokens, cfg.hidden_size, generator=torch.Generator().manual_seed(9)))
    assert cfg.hidden_size <= fast.LOOP_HIDDEN and calls == [1, fast.LOOP_TOKENS]


def test_expert_weights_stay_one_copy_and_follow_changes(layer):
    """The stack the experts run from is their weights: an in-place change of an expert's weight
    is the fast path's too, and replacing its tensor is seen as well."""
    cfg, moe = layer
    x = torch.randn(32, cfg.hidden_size, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    fast.forward(moe, x)
    stacked = fast.Stacked.of(moe)
    assert moe.experts[2].w3.weight.untyped_storage().data_ptr() == stacked.up.untyped_storage().data_ptr()
    with torch.no_grad():
        moe.experts[2].w3.weight.mul_(-2)
        moe.shared_experts.w2.weight.mul_(0.5)
    assert relative(fast.forward(moe, x), moe(x)) < 1e-13
    moe.experts[0].w1.weight.data = moe.experts[0].w1.weight.data.clone() * 3
    assert relative(fast.forward(moe, x), moe(x)) < 1e-13


def test_bfloat16_runs_the_same_experts(layer):
    cfg, moe = layer
    moe = moe.to(torch.bfloat16)
    x = torch.randn(6, cfg.hidden_size, generator=torch.Generator().manual_seed(2)).bfloat16()
    assert torch.equal(fast.route(moe.gate, x, None)[1], moe.gate(x)[1])
    assert relative(fast.forward(moe, x).float(), moe(x).float()) < 2e-2
