import math

import torch

from sglang_ds41.model.mhc import HyperConnection, collapse, expand, first_pre, sinkhorn

from ._tiny import tiny_config


def test_sinkhorn_two_rounds_match_hand_computation():
    # Row softmax of [[0, ln 3], [0, 0]] = [[1/4, 3/4], [1/2, 1/2]]; columns -> [[1/3, 3/5], [2/3, 2/5]];
    # rows -> [[5/14, 9/14], [5/8, 3/8]]; columns -> [[4/11, 12/19], [7/11, 7/19]].
    z = torch.tensor([[0.0, math.log(3)], [0.0, 0.0]], dtype=torch.float64)
    expected = torch.tensor([[4 / 11, 12 / 19], [7 / 11, 7 / 19]], dtype=torch.float64)
    assert torch.allclose(sinkhorn(z, iters=2, eps=0.0), expected, rtol=1e-14, atol=0)


def test_sinkhorn_adds_eps_after_the_softmax_and_to_each_sum():
    # eps = 0.5: softmax + eps = [[3/4, 5/4], [1, 1]]; column sums + eps = 9/4, 11/4.
    z = torch.tensor([[0.0, math.log(3)], [0.0, 0.0]], dtype=torch.float64)
    expected = torch.tensor([[1 / 3, 5 / 11], [4 / 9, 4 / 11]], dtype=torch.float64)
    assert torch.allclose(sinkhorn(z, iters=1, eps=0.5), expected, rtol=1e-14, atol=0)


def test_sinkhorn_output_is_doubly_stochastic():
    gen = torch.Generator().manual_seed(0)
    z = torch.randn(64, 4, 4, generator=gen, dtype=torch.float64)
    c = sinkhorn(z, iters=20, eps=1e-6)
    ones = torch.ones(64, 4, dtype=torch.float64)
    assert (c > 0).all()
    # Columns are normalised last (off by ~eps); rows have converged to within a few eps.
    assert torch.allclose(c.sum(dim=-2), ones, rtol=0, atol=2e-6)
    assert torch.allclose(c.sum(dim=-1), ones, rtol=0, atol=1e-5)


def test_coefficients_from_biases_alone():
    cfg = tiny_config()
    site = HyperConnection(cfg).to(torch.float64)
    base = torch.linspace(-2, 2, 24, dtype=torch.float64)
    with torch.no_grad():
        site.base.copy_(base)
    r = torch.randn(3, 4, cfg.hidden_size, dtype=torch.float64)
    pre, post, comb = site(r)  # fn = 0: every mixing logit is its bias
    assert torch.allclose(pre, (torch.sigmoid(base[:4]) + 1e-6).expand(3, 4), rtol=1e-15, atol=0)
    assert torch.allclose(post, (2 * torch.sigmoid(base[4:8])).expand(3, 4), rtol=1e-15, atol=0)
    z = base[8:].view(4, 4)  # row-major: row j = input copy, column k = output copy
    assert torch.allclose(comb, sinkhorn(z, 20, 1e-6).expand(3, 4, 4), rtol=1e-15, atol=0)


def test_mixing_logits_use_one_unweighted_rms_over_all_copies():
    cfg = tiny_config()
    site = HyperConnection(cfg).to(torch.float64)
    d = cfg.hidden_size
    with torch.no_grad():
        site.fn.zero_()
        site.fn[0, :d] = 1.0  # pre logit of copy 0 = sum of copy 0 (times 1/RMS)
        site.scale.copy_(torch.tensor([0.5, 1.0, 1.0]))
    r = torch.zeros(1, 4, d, dtype=torch.float64)
    r[0, 0] = 2.0  # copy 0 all 2, others 0: RMS over 4*d values = sqrt(4/4) = 1
    pre, _, _ = site(r)
    assert math.isclose(pre[0, 0].item(), 1 / (1 + math.exp(-0.5 * 2 * d)) + 1e-6, rel_tol=1e-14)
    assert math.isclose(pre[0, 1].item(), 0.5 + 1e-6, rel_tol=1e-14)


def test_expand_sums_over_the_input_index_of_comb():
    r = torch.tensor([[[1.0], [10.0], [100.0]]], dtype=torch.float64)  # [T=1, hc=3, D=1]
    comb = torch.zeros(1, 3, 3, dtype=torch.float64)
    comb[0, 0, 1] = 1.0  # input copy 0 -> output copy 1
    comb[0, 1, 2] = 1.0  # 1 -> 2
    comb[0, 2, 0] = 1.0  # 2 -> 0
    post = torch.tensor([[0.0, 1.0, 2.0]], dtype=torch.float64)
    y = torch.tensor([[5.0]], dtype=torch.float64)
    out = expand(r, y, post, comb)
    assert out.flatten().tolist() == [100.0, 1.0 + 5.0, 10.0 + 10.0]


def test_first_pre_collapses_to_copy_zero():
    r = torch.randn(5, 4, 8, dtype=torch.float64)
    assert torch.equal(collapse(r, first_pre(r)), r[:, 0])
    pre = torch.tensor([[0.5, 0.25, 0.0, 2.0]], dtype=torch.float64).expand(5, 4)
    assert torch.allclose(collapse(r, pre), 0.5 * r[:, 0] + 0.25 * r[:, 1] + 2 * r[:, 3], rtol=1e-15, atol=0)
