"""Engram layer math (MODEL.md §5.6) against a float64 implementation written from the spec formulas."""

from __future__ import annotations

import math
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from sglang_ds41.engram.gate import EngramGate, apply_engram, gate_weight

T, HC, D, N_COLUMNS, HEAD_DIM = 5, 4, 64, 6, 32
EPS = 1e-20


def spec_engram(R, E, wkv, q, k, image, eps=EPS):
    """§5.6 step by step, per token and per copy, in float64 numpy."""
    R, E, wkv, q, k = (np.asarray(x, dtype=np.float64) for x in (R, E, wkv, q, k))
    t_count, hc, d = R.shape
    out = R.copy()
    for t in range(t_count):
        if image[t]:
            continue  # step 7
        kv = wkv @ E[t].reshape(-1)  # steps 1-2
        key = kv[: hc * d].reshape(hc, d)
        val = kv[hc * d :]
        for c in range(hc):
            w = q[c] * k[c]  # step 3
            dot = sum(R[t, c, i] * w[i] * key[c, i] for i in range(d))  # step 4
            dot *= 1 / math.sqrt(np.mean(R[t, c] ** 2) + eps)
            dot *= 1 / math.sqrt(np.mean(key[c] ** 2) + eps)
            dot *= d**-0.5
            s = math.copysign(1.0, dot) if dot != 0 else 0.0
            g = 1 / (1 + math.exp(-(s * math.sqrt(max(abs(dot), 1e-6)))))  # step 5
            out[t, c] = R[t, c] + g * val  # step 6
    return out


def random_inputs(dtype, seed=0):
    gen = torch.Generator().manual_seed(seed)
    R = torch.randn(T, HC, D, generator=gen, dtype=torch.float64).to(dtype)
    E = torch.randn(T, N_COLUMNS, HEAD_DIM, generator=gen, dtype=torch.float64).to(dtype)
    wkv = torch.randn((HC + 1) * D, N_COLUMNS * HEAD_DIM, generator=gen, dtype=torch.float64)
    wkv = (wkv * 0.05).to(dtype)
    q = torch.randn(HC, D, generator=gen, dtype=torch.float64).to(dtype)
    k = torch.randn(HC, D, generator=gen, dtype=torch.float64).to(dtype)
    return R, E, wkv, q, k


def make_gate(wkv, q, k, dtype):
    gate = EngramGate(hidden_size=D, hc_mult=HC, n_columns=N_COLUMNS, head_dim=HEAD_DIM, eps=EPS, dtype=dtype)
    with torch.no_grad():
        gate.wkv.weight.copy_(wkv)
        gate.q_weight.copy_(q)
        gate.k_weight.copy_(k)
    return gate


def test_float64_forward_matches_spec_formulas():
    R, E, wkv, q, k = random_inputs(torch.float64)
    image = torch.tensor([False, False, True, False, False])
    got = make_gate(wkv, q, k, torch.float64)(R, E, image)
    want = spec_engram(R, E, wkv, q, k, image.tolist())
    np.testing.assert_allclose(got.detach().numpy(), want, rtol=1e-12, atol=1e-12)


def test_bf16_forward_is_close_to_spec_formulas():
    R, E, wkv, q, k = random_inputs(torch.bfloat16, seed=1)
    got = make_gate(wkv, q, k, torch.bfloat16)(R, E).float().detach().numpy()
    want = spec_engram(R.float(), E.float(), wkv.float(), q.float(), k.float(), [False] * T)
    # bf16 kv + bf16 output: a few bf16 ulps of the largest values
    np.testing.assert_allclose(got, want, rtol=0.01, atol=0.02)


def test_image_rows_are_untouched_bit_for_bit():
    R, E, wkv, q, k = random_inputs(torch.bfloat16, seed=2)
    image = torch.tensor([True, False, True, True, False])
    out = make_gate(wkv, q, k, torch.bfloat16)(R, E, image)
    assert torch.equal(out[image], R[image])
    assert not torch.equal(out[~image], R[~image])


def test_zero_key_gives_half_gate():
    # key = 0 -> dot = 0 -> sign(0) = 0 -> g = sigmoid(0) = 1/2, so R' = R + value / 2
    R, E, wkv, q, k = random_inputs(torch.float64, seed=3)
    wkv[: HC * D] = 0
    out = make_gate(wkv, q, k, torch.float64)(R, E)
    value = E.reshape(T, -1) @ wkv[HC * D :].T
    torch.testing.assert_close(out, R + 0.5 * value[:, None, :], rtol=1e-14, atol=1e-14)


def test_gate_is_per_copy_scale_invariant():
    # normalised per (token, copy): scaling one copy's residual leaves the other copies' updates alone
    # and changes its own update only through R itself (the gate stays the same)
    R, E, wkv, q, k = random_inputs(torch.float64, seed=4)
    gate = make_gate(wkv, q, k, torch.float64)
    base = gate(R, E) - R
    R2 = R.clone()
    R2[:, 1] *= 7.0
    torch.testing.assert_close(gate(R2, E) - R2, base, rtol=1e-12, atol=1e-12)


def test_apply_engram_takes_a_precomputed_projection():
    R, E, wkv, q, k = random_inputs(torch.float64, seed=5)
    kv = E.reshape(T, -1) @ wkv.T
    got = apply_engram(R, kv, gate_weight(q, k), EPS)
    want = spec_engram(R, E, wkv, q, k, [False] * T)
    np.testing.assert_allclose(got.numpy(), want, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_from_config_sizes(dtype):
    cfg = SimpleNamespace(
        hidden_size=64,
        hc_mult=4,
        engram_max_ngram_size=4,
        engram_n_heads=2,
        engram_head_dim=32,
        rms_norm_eps=1e-20,
    )
    gate = EngramGate.from_config(cfg, dtype=dtype)
    assert gate.wkv.weight.shape == (5 * 64, 6 * 32)
    assert gate.q_weight.shape == gate.k_weight.shape == (4, 64)
    assert gate.wkv.weight.dtype == dtype
    assert sorted(n for n, _ in gate.named_parameters()) == ["k_weight", "q_weight", "wkv.weight"]
