"""The MoE layer (`model.moe`, MODEL.md §6) with experts grouped: one pass per expert used.

    route(gate, x, is_image)  = gate(x, is_image)        one GEMM + one loop
    forward(moe, x, is_image) = moe(x, is_image)

The oracle loops over experts with masks and runs the gate and up projections apart; here the
tokens are sorted by expert once, each expert used runs one GEMM of its gate and up weights
stacked ([2I, D], built once per layer), the clamped SwiGLU is one loop for a few rows (the
oracle's ops for more), and the weighted outputs are added token by token in the oracle's order
(shared expert, then ascending expert id) with one `index_add_`.

A decode step's few tokens (up to LOOP_TOKENS, at a hidden size of at most LOOP_HIDDEN) run
all of it in one compiled loop instead, token by token: each of its experts' rows a vectorised
dot product with the token, the SwiGLU, the down projection, added in the same order. Its ~20
torch ops a layer cost more than the arithmetic there. Measured (one layer, one thread, beside
a training run; hidden 128 / expert width 128, 8 experts, top 2 + shared): 1 / 16 tokens 0.117 /
0.44 ms -> 0.053 / 0.32 ms (at 32 tokens the GEMMs win: 0.50 vs 0.60); hidden 64 / width 32
0.088 / 0.275 -> 0.032 / 0.094. Given its routing, each token's output is a function of that
token alone, the same bits in any batch (the router's GEMM makes no such promise).
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

from sglang_ds41.model.moe import ROUTE_NORM_EPS, Gate, MoE
from sglang_ds41.model.norm import upcast

from .jit import compiled, compiles, host_empty, numpy_of, prepared

SOFTPLUS_THRESHOLD = 20.0  # F.softplus's default: above it, softplus(x) = x
# Below this many rows the SwiGLU loop beats torch's five ops (~9 us); past it their vectorised
# exp wins (the loop's float64 exp: ~0.02 us per element; measured crossover ~16 rows of I = 128).
LOOP_ROWS = 16
# Up to this many tokens at a hidden size of at most LOOP_HIDDEN (the sizes measured), the layer
# is one compiled loop (module doc).
LOOP_TOKENS = 16
LOOP_HIDDEN = 256


@compiled
def _route(logits, bias, bias_vl, is_image, temp, norm, scale, eps, weights, ids):
    """Scores sqrt(softplus(logits / temp)); the k best of scores + bias (bias_vl for image
    rows; ties to the lower expert id), weighted by their unbiased scores."""
    t_rows, n = logits.shape
    k = ids.shape[1]
    scores = np.empty(n)
    taken = np.zeros(n, dtype=np.bool_)
    for t in range(t_rows):
        for e in range(n):
            z = logits[t, e] / temp
            scores[e] = np.sqrt(z if z > SOFTPLUS_THRESHOLD else np.log1p(np.exp(z)))
            taken[e] = False
        total = 0.0
        for j in range(k):
            best, pick = -np.inf, 0
            for e in range(n):
                v = scores[e] + (bias_vl[e] if is_image[t] else bias[e])
                if not taken[e] and v > best:
                    best, pick = v, e
            taken[pick] = True
            ids[t, j] = pick
            weights[t, j] = scores[pick]
            total += scores[pick]
        for j in range(k):
            w = weights[t, j] / (total + eps) if norm else weights[t, j]
            weights[t, j] = w * scale


def route(gate: Gate, x: torch.Tensor, is_image: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    """`gate(x, is_image)`: (weights [T, k] in the upcast dtype, expert ids [T, k])."""
    if not compiles(x):
        return gate(x, is_image)
    logits = F.linear(upcast(x), upcast(gate.weight))  # [T, E]
    t = x.shape[0]
    image = torch.zeros(t, dtype=torch.bool) if is_image is None else is_image
    weights, weights_ = host_empty(t, gate.topk, dtype=logits.dtype)
    ids, ids_ = host_empty(t, gate.topk, dtype=torch.int64)
    bias, bias_vl = prepared(
        gate, f"_fast_{logits.dtype}", lambda: _biases(gate, logits.dtype), gate.bias, gate.bias_vl
    )
    _route(
        numpy_of(logits), bias, bias_vl, numpy_of(image), gate.temp, gate.norm_topk_prob,
        gate.route_scale, ROUTE_NORM_EPS, weights_, ids_,
    )  # fmt: skip
    return weights, ids


def _biases(gate: Gate, dtype: torch.dtype) -> tuple[np.ndarray, np.ndarray]:
    return numpy_of(gate.bias.detach().to(dtype)), numpy_of(gate.bias_vl.detach().to(dtype))


@compiled
def _swiglu(h, limit, out):
    """h = [gate | up] [n, 2I] -> silu(min(gate, limit)) * clamp(up, -limit, limit) [n, I]."""
    for r in range(out.shape[0]):
        _swiglu_row(h[r], limit, out[r])


@compiled
def _swiglu_row(h, limit, out):
    """`_swiglu` of one row: h [2I] -> out [I]."""
    width = out.shape[0]
    for i in range(width):
        g = min(h[i], limit)
        u = min(max(h[width + i], -limit), limit)
        out[i] = g / (1.0 + np.exp(-g)) * u


class Stacked:
    """An MoE layer's experts as stacked tensors: gate|up [E + 1, 2I, D] and down [E + 1, D, I],
    the shared expert last. The experts' parameters become views into them (no second copy,
    and a change to a parameter is a change to the stack)."""

    def __init__(self, moe: MoE):
        experts = [*moe.experts, moe.shared_experts]
        with torch.no_grad():
            self.up = torch.stack([torch.cat([e.w1.weight, e.w3.weight]) for e in experts])
            self.down = torch.stack([e.w2.weight for e in experts])
        inter = experts[0].w1.weight.shape[0]
        for i, e in enumerate(experts):
            e.w1.weight.data, e.w3.weight.data = self.up[i, :inter], self.up[i, inter:]
            e.w2.weight.data = self.down[i]
        self.limit = moe.shared_experts.limit

    @classmethod
    def of(cls, moe: MoE) -> Stacked:
        return prepared(moe, "_fast", lambda: cls(moe), moe.experts[0].w1.weight)

    def run(self, e: int, x: torch.Tensor) -> torch.Tensor:
        """Expert `e` (the shared one at E) on rows x [n, D] -> [n, D] in x's dtype."""
        h = F.linear(x, self.up[e])  # [n, 2I]
        if compiles(h) and h.shape[0] < LOOP_ROWS:
            act, act_ = host_empty(h.shape[0], h.shape[1] // 2, dtype=h.dtype)
            _swiglu(numpy_of(h), self.limit, act_)
        else:
            gate, up = upcast(h).chunk(2, dim=-1)
            act = (F.silu(gate.clamp(max=self.limit)) * up.clamp(-self.limit, self.limit)).to(x.dtype)
        return F.linear(act, self.down[e])


def forward(moe: MoE, x: torch.Tensor, is_image: torch.Tensor | None = None) -> torch.Tensor:
    """`moe(x, is_image)`: x [T, D] (normed collapse) -> [T, D]."""
    weights, ids = route(moe.gate, x, is_image)  # [T, k]
    stacked = Stacked.of(moe)
    few = x.shape[0] <= LOOP_TOKENS and x.shape[1] <= LOOP_HIDDEN
    if few and compiles(x) and x.dtype == stacked.up.dtype:
        out, out_ = host_empty(*x.shape, dtype=x.dtype)
        _token_by_token(
            numpy_of(x.contiguous()), numpy_of(weights), numpy_of(ids), numpy_of(stacked.up),
            numpy_of(stacked.down), stacked.limit, out_,
        )  # fmt: skip
        return out
    y = upcast(stacked.run(len(moe.experts), x))  # the shared expert
    add_by_expert(stacked, x, weights, ids, y)
    return y.to(x.dtype)


@compiled(reassociate=True)
def _token_by_token(x, weights, ids, up, down, limit, out):
    """out[t] = shared(x[t]) + the sum of t's experts' weighted outputs in ascending expert id;
    up [E + 1, 2I, D], down [E + 1, D, I], the shared expert last (`Stacked`)."""
    t_rows, d = x.shape
    k = ids.shape[1]
    inter = down.shape[2]
    h = np.empty(2 * inter, x.dtype)
    act = np.empty(inter, x.dtype)
    order = np.empty(k, np.int64)
    zero = np.zeros(1, x.dtype)[0]
    for t in range(t_rows):
        for j in range(k):  # t's experts in ascending id: an insertion sort of k slots
            pick, i = j, j - 1
            while i >= 0 and ids[t, order[i]] > ids[t, pick]:
                order[i + 1] = order[i]
                i -= 1
            order[i + 1] = pick
        for step in range(k + 1):
            e = up.shape[0] - 1 if step == 0 else ids[t, order[step - 1]]
            for i in range(2 * inter):
                s = zero
                for c in range(d):
                    s += up[e, i, c] * x[t, c]
                h[i] = s
            _swiglu_row(h, limit, act)
            for o in range(d):
                s = zero
                for i in range(inter):
                    s += down[e, o, i] * act[i]
                out[t, o] = s if step == 0 else out[t, o] + weights[t, order[step - 1]] * s


def add_by_expert(
    stacked: Stacked, x: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor, y: torch.Tensor
) -> None:
    """y [T, D] += each token's routed experts' weighted outputs, in ascending expert id: the
    tokens sorted by expert, one run per expert used, one `index_add_`."""
    k = ids.shape[1]
    order = ids.flatten().argsort(stable=True)  # slots by expert, tokens ascending within one
    counts = torch.bincount(ids.flatten(), minlength=stacked.up.shape[0] - 1).tolist()
    rows = torch.div(order, k, rounding_mode="floor")
    picked = x[rows]
    outs, first = [], 0
    for e, n in enumerate(counts):
        if n:
            outs.append(stacked.run(e, picked[first : first + n]))
            first += n
    if outs:
        y.index_add_(0, rows, weights.flatten()[order, None] * upcast(torch.cat(outs)))
