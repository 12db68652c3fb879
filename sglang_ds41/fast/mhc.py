"""The hyper-connection stream (`model.mhc`, MODEL.md §3) in three compiled loops.

    coefficients(site, R)          = site(R)                      one GEMM + one loop
    collapse_norm(R, pre, norm)    = norm(collapse(R, pre))       one loop
    expand(R, y, post, comb)       = mhc.expand(R, y, post, comb) one loop

Loops accumulate in float64, so float32 results may differ from the op-by-op oracle in the
last bit; float64 results agree to rounding. Other dtypes (bfloat16, which numpy lacks) take
the oracle.
"""

from __future__ import annotations

import numpy as np
import torch

from sglang_ds41.model import mhc
from sglang_ds41.model.mhc import HcCoeffs, HyperConnection
from sglang_ds41.model.norm import RMSNorm, upcast

from .jit import compiled, compiles, host_empty, numpy_of, prepared

# Tokens whose Sinkhorn rounds run side by side, one to a SIMD lane (the matrices are 4 x 4:
# a loop over one matrix's entries is too short to vectorise).
BLOCK = 64


@compiled(ieee_division=True)
def _mixes(flat, m, base, scale, norm_eps, iters, hc_eps, pre, post, comb):
    """m [T, (2+hc)*hc] = flat @ fn^T -> pre, post, comb (split_mixes of m * rms_scale(flat)).
    The comb rounds run on a block of tokens at a time, laid out [hc, hc, BLOCK] so that every
    loop over the block vectorises; each entry's arithmetic is the per-token loop's."""
    t_rows = flat.shape[0]
    hc = pre.shape[1]
    w = np.empty((hc, hc, BLOCK), comb.dtype)
    r = np.empty(BLOCK)
    top = np.empty(BLOCK)
    s = np.empty(BLOCK)
    for t0 in range(0, t_rows, BLOCK):
        n = min(BLOCK, t_rows - t0)
        _inverse_rms(flat[t0 : t0 + n], norm_eps, r)
        for b in range(n):
            t = t0 + b
            for k in range(hc):
                pre[t, k] = 1.0 / (1.0 + np.exp(-(m[t, k] * r[b] * scale[0] + base[k]))) + hc_eps
                post[t, k] = 2.0 / (1.0 + np.exp(-(m[t, hc + k] * r[b] * scale[1] + base[hc + k])))
        for j in range(hc):  # the first round: a row softmax, then columns
            top[:n] = -np.inf
            for k in range(hc):
                col = 2 * hc + j * hc + k
                for b in range(n):
                    z = m[t0 + b, col] * r[b] * scale[2] + base[col]
                    w[j, k, b] = z
                    top[b] = max(top[b], z)
            s[:n] = 0.0
            for k in range(hc):
                for b in range(n):
                    w[j, k, b] = np.exp(w[j, k, b] - top[b])
                    s[b] += w[j, k, b]
            for k in range(hc):
                for b in range(n):
                    w[j, k, b] = w[j, k, b] / s[b] + hc_eps
        _normalise_columns(w, s, n, hc_eps)
        for _ in range(iters - 1):
            _normalise_rows(w, s, n, hc_eps)
            _normalise_columns(w, s, n, hc_eps)
        for b in range(n):
            for j in range(hc):
                for k in range(hc):
                    comb[t0 + b, j, k] = w[j, k, b]


@compiled(reassociate=True)
def _sum_of_squares(v):
    """sum(v^2) in float64, vectorised (a function of v alone: the same bits for the same row)."""
    ss = 0.0
    for i in range(v.shape[0]):
        ss += np.float64(v[i]) * v[i]
    return ss


@compiled(ieee_division=True)
def _inverse_rms(x, eps, out):
    """out[t] = 1 / sqrt(mean(x[t]^2) + eps)."""
    rows, width = x.shape
    for t in range(rows):
        out[t] = 1.0 / np.sqrt(_sum_of_squares(x[t]) / width + eps)


@compiled(ieee_division=True)
def _normalise_rows(w, s, n, eps):
    """Each row j of the first n matrices w[:, :, b] divided by (its sum + eps), in place."""
    hc = w.shape[0]
    for j in range(hc):
        s[:n] = 0.0
        for k in range(hc):
            for b in range(n):
                s[b] += w[j, k, b]
        for k in range(hc):
            for b in range(n):
                w[j, k, b] = w[j, k, b] / (s[b] + eps)


@compiled(ieee_division=True)
def _normalise_columns(w, s, n, eps):
    """Each column k of the first n matrices w[:, :, b] divided by (its sum + eps), in place.
    (`_normalise_rows` of w.transpose((1, 0, 2)) gives the same bits, but numba compiles that
    strided view into loops that do not vectorise: the rounds took twice as long.)"""
    hc = w.shape[0]
    for k in range(hc):
        s[:n] = 0.0
        for j in range(hc):
            for b in range(n):
                s[b] += w[j, k, b]
        for j in range(hc):
            for b in range(n):
                w[j, k, b] = w[j, k, b] / (s[b] + eps)


def coefficients(site: HyperConnection, r: torch.Tensor) -> HcCoeffs:
    """`site(r)`: R [T, hc, D] -> pre, post, comb in the upcast dtype."""
    if not compiles(r):
        return site(r)
    flat = upcast(r).flatten(1)  # [T, hc*D]
    build = lambda: _site_weights(site, flat.dtype)  # noqa: E731
    fn_t, base, scale = prepared(site, f"_fast_{flat.dtype}", build, site.fn, site.base, site.scale)
    m = flat @ fn_t  # [T, (2+hc)*hc]
    t, hc = r.shape[0], site.hc
    (pre, pre_), (post, post_) = host_empty(t, hc, dtype=m.dtype), host_empty(t, hc, dtype=m.dtype)
    comb, comb_ = host_empty(t, hc, hc, dtype=m.dtype)
    _mixes(
        numpy_of(flat), numpy_of(m), base, scale, site.norm_eps, site.sinkhorn_iters, site.hc_eps,
        pre_, post_, comb_,
    )  # fmt: skip
    return HcCoeffs(pre, post, comb)


def _site_weights(site: HyperConnection, dtype: torch.dtype) -> tuple[torch.Tensor, np.ndarray, np.ndarray]:
    """fn^T as the GEMM wants it, base and scale as arrays, in the stream's upcast dtype."""
    fn_t = site.fn.detach().to(dtype).T.contiguous()
    return fn_t, numpy_of(site.base.detach().to(dtype)), numpy_of(site.scale.detach().to(dtype))


@compiled(ieee_division=True)
def _collapse_norm(r, pre, weight, eps, out):
    """The sums run along D (contiguous, so they vectorise), each element's terms in the
    order k = 0..hc-1 as before."""
    t_rows, hc, d = r.shape
    x = np.empty(d)
    for t in range(t_rows):
        x[:] = 0.0
        for k in range(hc):
            p = pre[t, k]
            for i in range(d):
                x[i] += p * r[t, k, i]
        scale = 1.0 / np.sqrt(_sum_of_squares(x) / d + eps)
        for i in range(d):
            out[t, i] = x[i] * scale * weight[i]


def collapse_norm(r: torch.Tensor, pre: torch.Tensor, norm: RMSNorm) -> torch.Tensor:
    """`norm(collapse(r, pre))`: R [T, hc, D], pre [T, hc] -> [T, D] in R's dtype."""
    if not compiles(r):
        return norm(mhc.collapse(r, pre))
    out, out_ = host_empty(r.shape[0], r.shape[2], dtype=r.dtype)
    weight = prepared(norm, "_fast", lambda: numpy_of(upcast(norm.weight.detach())), norm.weight)
    _collapse_norm(numpy_of(r), numpy_of(upcast(pre)), weight, norm.eps, out_)
    return out


@compiled(ieee_division=True)
def _expand(r, y, post, comb, out):
    """Accumulates in `out` along D (contiguous: 9x faster than a sum per element at T = 512),
    each element's terms in the oracle's order, rounded to out's dtype at every step: the
    wrapper sends mixed dtypes to the oracle."""
    t_rows, hc, d = r.shape
    for t in range(t_rows):
        for k in range(hc):
            p = post[t, k]
            for i in range(d):
                out[t, k, i] = p * y[t, i]
            for j in range(hc):
                c = comb[t, j, k]
                for i in range(d):
                    out[t, k, i] += c * r[t, j, i]


def expand(r: torch.Tensor, y: torch.Tensor, post: torch.Tensor, comb: torch.Tensor) -> torch.Tensor:
    """`mhc.expand`: R' = post * y + comb^T R, [T, hc, D] in R's dtype."""
    post, comb = upcast(post), upcast(comb)
    if not compiles(r) or not r.dtype == y.dtype == post.dtype == comb.dtype:
        return mhc.expand(r, y, post, comb)
    out, out_ = host_empty(*r.shape, dtype=r.dtype)
    _expand(numpy_of(r), numpy_of(y), numpy_of(post), numpy_of(comb), out_)
    return out
