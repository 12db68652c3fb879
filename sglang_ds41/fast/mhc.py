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

from .jit import compiled, compiles, numpy_of, prepared


@compiled(ieee_division=True)
def _mixes(flat, m, base, scale, norm_eps, iters, hc_eps, pre, post, comb):
    """m [T, (2+hc)*hc] = flat @ fn^T -> pre, post, comb (split_mixes of m * rms_scale(flat))."""
    t_rows, width = flat.shape
    hc = pre.shape[1]
    for t in range(t_rows):
        ss = 0.0
        for i in range(width):
            ss += flat[t, i] * flat[t, i]
        r = 1.0 / np.sqrt(ss / width + norm_eps)
        for k in range(hc):
            pre[t, k] = 1.0 / (1.0 + np.exp(-(m[t, k] * r * scale[0] + base[k]))) + hc_eps
            post[t, k] = 2.0 / (1.0 + np.exp(-(m[t, hc + k] * r * scale[1] + base[hc + k])))
        c = comb[t]
        for j in range(hc):  # the first round: a row softmax, then columns
            top = -np.inf
            for k in range(hc):
                z = m[t, 2 * hc + j * hc + k] * r * scale[2] + base[2 * hc + j * hc + k]
                c[j, k] = z
                top = max(top, z)
            s = 0.0
            for k in range(hc):
                c[j, k] = np.exp(c[j, k] - top)
                s += c[j, k]
            for k in range(hc):
                c[j, k] = c[j, k] / s + hc_eps
        _normalise(c.T, hc_eps)  # columns
        for _ in range(iters - 1):
            _normalise(c, hc_eps)  # rows
            _normalise(c.T, hc_eps)


@compiled(ieee_division=True)
def _normalise(c, eps):
    """Each row of c divided by (its sum + eps), in place (c.T: the columns)."""
    n = c.shape[0]
    for j in range(n):
        s = 0.0
        for k in range(n):
            s += c[j, k]
        for k in range(n):
            c[j, k] = c[j, k] / (s + eps)


def coefficients(site: HyperConnection, r: torch.Tensor) -> HcCoeffs:
    """`site(r)`: R [T, hc, D] -> pre, post, comb in the upcast dtype."""
    if not compiles(r):
        return site(r)
    flat = upcast(r).flatten(1)  # [T, hc*D]
    build = lambda: _site_weights(site, flat.dtype)  # noqa: E731
    fn_t, base, scale = prepared(site, f"_fast_{flat.dtype}", build, site.fn, site.base, site.scale)
    m = flat @ fn_t  # [T, (2+hc)*hc]
    t, hc = r.shape[0], site.hc
    pre, post, comb = m.new_empty(t, hc), m.new_empty(t, hc), m.new_empty(t, hc, hc)
    _mixes(
        numpy_of(flat), numpy_of(m), base, scale, site.norm_eps, site.sinkhorn_iters, site.hc_eps,
        numpy_of(pre), numpy_of(post), numpy_of(comb),
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
        ss = 0.0
        for i in range(d):
            ss += x[i] * x[i]
        scale = 1.0 / np.sqrt(ss / d + eps)
        for i in range(d):
            out[t, i] = x[i] * scale * weight[i]


def collapse_norm(r: torch.Tensor, pre: torch.Tensor, norm: RMSNorm) -> torch.Tensor:
    """`norm(collapse(r, pre))`: R [T, hc, D], pre [T, hc] -> [T, D] in R's dtype."""
    if not compiles(r):
        return norm(mhc.collapse(r, pre))
    out = r.new_empty(r.shape[0], r.shape[2])
    weight = prepared(norm, "_fast", lambda: numpy_of(upcast(norm.weight.detach())), norm.weight)
    _collapse_norm(numpy_of(r), numpy_of(upcast(pre)), weight, norm.eps, numpy_of(out))
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
    out = torch.empty_like(r)
    _expand(numpy_of(r), numpy_of(y), numpy_of(post), numpy_of(comb), numpy_of(out))
    return out
