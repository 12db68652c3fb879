"""The compiled hyper-connection loops against `model.mhc`, their oracle."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from sglang_ds41.fast import mhc as fast
from sglang_ds41.model.mhc import HyperConnection, collapse, expand
from sglang_ds41.model.norm import RMSNorm
from tests.model._tiny import randomize_, tiny_config


def relative(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).abs().max() / b.abs().max())


@pytest.fixture(scope="module")
def parts():
    cfg = tiny_config()
    site = randomize_(HyperConnection(cfg), seed=1).requires_grad_(False)
    with torch.no_grad():
        site.fn.mul_(0.2)  # mixes of order 1, as trained sites give
    norm = randomize_(RMSNorm(cfg.hidden_size, cfg.rms_norm_eps), seed=2).requires_grad_(False)
    return cfg, site, norm


@pytest.mark.parametrize("tokens", [1, 5, fast.BLOCK, fast.BLOCK + 1, 2 * fast.BLOCK + 7])
def test_float64_equals_the_oracle_to_rounding(parts, tokens):
    cfg, site, norm = parts
    gen = torch.Generator().manual_seed(tokens)
    r = torch.randn(tokens, cfg.hc_mult, cfg.hidden_size, generator=gen, dtype=torch.float64)
    y = torch.randn(tokens, cfg.hidden_size, generator=gen, dtype=torch.float64)
    want, got = site(r), fast.coefficients(site, r)
    for name, a, b in zip(("pre", "post", "comb"), got, want, strict=True):
        assert relative(a, b) < 1e-13, name
    assert relative(fast.collapse_norm(r, want.pre, norm), norm(collapse(r, want.pre))) < 1e-13
    assert relative(fast.expand(r, y, want.post, want.comb), expand(r, y, want.post, want.comb)) < 1e-13


def test_float32_stays_within_float32_rounding(parts):
    cfg, site, norm = parts
    site32, norm32 = HyperConnection(cfg).requires_grad_(False), RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
    site32.load_state_dict(site.state_dict()), norm32.load_state_dict(norm.state_dict())
    r = torch.randn(9, cfg.hc_mult, cfg.hidden_size, generator=torch.Generator().manual_seed(0))
    for a, b in zip(fast.coefficients(site32.float(), r), site32.float()(r), strict=True):
        assert a.dtype == torch.float32 and relative(a, b) < 1e-5
    assert (
        relative(
            fast.collapse_norm(r, site32(r).pre, norm32.requires_grad_(False)),
            norm32(collapse(r, site32(r).pre)),
        )
        < 1e-5
    )


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_a_tokens_mixes_do_not_depend_on_its_neighbours(dtype):
    """The Sinkhorn rounds run a block of tokens side by side: each token's coefficients are
    still the bits it gets alone, wherever it sits in a block."""
    hc, width, tokens = 4, 32, fast.BLOCK + 9
    gen = np.random.default_rng(5)
    flat = gen.standard_normal((tokens, hc * width)).astype(dtype)
    m = (gen.standard_normal((tokens, (2 + hc) * hc)) * 8).astype(dtype)
    base, scale = gen.standard_normal((2 + hc) * hc).astype(dtype), gen.standard_normal(3).astype(dtype)

    def mixes(rows: slice) -> tuple[np.ndarray, ...]:
        n = len(range(tokens)[rows])
        out = np.empty((n, hc), dtype), np.empty((n, hc), dtype), np.empty((n, hc, hc), dtype)
        fast._mixes(flat[rows], m[rows], base, scale, 1e-6, 20, 1e-6, *out)
        return out

    whole = mixes(slice(None))
    for t in (0, 7, fast.BLOCK - 1, fast.BLOCK, tokens - 1):
        for a, b in zip(mixes(slice(t, t + 1)), whole, strict=True):
            assert np.array_equal(a[0], b[t])


def test_float32_expand_stays_within_float32_rounding(parts):
    cfg, site, _ = parts
    gen = torch.Generator().manual_seed(4)
    r = torch.randn(300, cfg.hc_mult, cfg.hidden_size, generator=gen)
    y = torch.randn(300, cfg.hidden_size, generator=gen)
    coeffs = site(r.double())
    post, comb = coeffs.post.float(), coeffs.comb.float()
    got = fast.expand(r, y, post, comb)
    assert got.dtype == torch.float32 and relative(got, expand(r, y, post, comb)) < 1e-6


def test_a_changed_weight_is_seen(parts):
    """The prepared weights follow an in-place update of the site's parameters."""
    cfg, site, _ = parts
    r = torch.randn(
        3, cfg.hc_mult, cfg.hidden_size, generator=torch.Generator().manual_seed(3), dtype=torch.float64
    )
    fast.coefficients(site, r)
    with torch.no_grad():
        site.base.add_(0.5)
    try:
        assert relative(fast.coefficients(site, r).pre, site(r).pre) < 1e-13
    finally:
        with torch.no_grad():
            site.base.sub_(0.5)


def test_bfloat16_takes_the_oracle(parts):
    cfg, site, _ = parts
    site16 = HyperConnection(cfg).requires_grad_(False)
    site16.load_state_dict(site.state_dict())
    site16.to(torch.bfloat16)
    r = torch.randn(4, cfg.hc_mult, cfg.hidden_size, generator=torch.Generator().manual_seed(4)).bfloat16()
    for a, b in zip(fast.coefficients(site16, r), site16(r), strict=True):
        assert torch.equal(a, b)
