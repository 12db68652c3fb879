"""The V4.1 math, written once for the reference model and the SGLang backend (MODEL.md §2–§6).

One module per concept: `norm` (RMSNorm, the upcast rule), `rope` (RoPE + YaRN), `mhc`
(hyper-connection coefficients, Sinkhorn, collapse/expand of the 4-copy stream), `roles`
(window / Full / Reindex / Reuse), `compressor`, `indexer` (scores, visibility, candidate
blocks, top-k: the definitions), `selection` (the same selection over bounded blocks of
entries, a running top-k), `batch` (a forward's requests as varlen rows, the pool layout),
`attention` (the layer, in phases), `moe` (router, clamped SwiGLU experts, shared expert).
Weights are dense tensors (the loader dequantises FP8 / MXFP4 / NVFP4); every module also runs
in float64, where chunked and one-shot forwards agree to rounding.

State (per request; §4.6). Nothing here allocates or evicts caches: `Attention.forward(x,
positions, state, published)` takes one request's chunk at contiguous positions `p0..p0+T-1`
and the layer's `AttentionState` from before the chunk, and returns `(y, state after the chunk)`.

* every layer: `state.window [n, head_dim]` — the window KV (post-RoPE, FP8 fake-quantised) of
  the n tokens right before p0, n >= min(p0, sliding_window - 1); returned with the last
  `sliding_window` tokens (a ring of that size in the backend).
* FULL (KV source): also `state.compressed = CompressedKV(kv [N, head_dim], index_keys [N,
  index_head_dim], pending)` with N = p0 // ratio before the call; `kv` = FP4(rope(latent_g,
  g*ratio)), `index_keys` = FP4 index keys; `pending` = the fp32 `(a, z)` rows [2, head_dim] of an
  even token still waiting for its pair (ratio 2 only; None when p0 is even). The returned
  state has the entries completed by the chunk appended.
* REINDEX / REUSE / WINDOW: only the window.
* Engram history and the mHC `pre` are not attention state (see `engram/`, `mhc`).

Phases (`attention`): `project` (q, window KV, new entries) -> the runtime commits them ->
`select` (window rows + top-k entries, as rows of the forward's logical pool) -> `attend`; they
run a whole batch of requests and read state through a `StateView`. `Attention.forward` is
their composition for one request with the state above as tensors (the reference runtime).

Per forward, layers run in order and share `Published`: each KV source puts its updated
`CompressedKV` (reference), each index source its selection `[T, k]` (entry rows, -1 = none),
the candidate source its kept block ids `[T, keep]`; REINDEX and REUSE layers read their
sources' entries.
`Published` is scratch: top-k and candidates are recomputed every forward, never cached.
Feeding a sequence in chunks (carrying the returned states) equals one shot, token for token;
for that, top-k ties go to the lower entry id (`indexer.stable_topk`; the spec leaves ties open).

Parameter names follow the checkpoint (`attn.wq_a`, `attn.compressor.wgate`, `ffn.gate.bias_vl`,
...), except that a `HyperConnection` holds `fn/base/scale` for the checkpoint's
`hc_{attn,ffn}_{fn,base,scale}`; the `pre` lag of V4.1 is spelled out in `mhc`'s docstring.
"""

from .attention import (
    Attention,
    AttentionState,
    CompressedKV,
    Projected,
    Published,
    StateView,
    TensorView,
    sparse_attention,
)
from .batch import Chunks
from .compressor import Compressor
from .indexer import Indexer, candidate_blocks, select_topk
from .mhc import HcCoeffs, HyperConnection, collapse, expand, first_pre, sinkhorn
from .moe import Expert, Gate, MoE
from .norm import RMSNorm, upcast
from .roles import LayerRole, layer_role
from .rope import RotaryEmbedding, rope_frequencies

__all__ = [
    "Attention",
    "AttentionState",
    "Chunks",
    "CompressedKV",
    "Compressor",
    "Expert",
    "Gate",
    "HcCoeffs",
    "HyperConnection",
    "Indexer",
    "LayerRole",
    "MoE",
    "Projected",
    "Published",
    "RMSNorm",
    "RotaryEmbedding",
    "StateView",
    "TensorView",
    "candidate_blocks",
    "collapse",
    "expand",
    "first_pre",
    "layer_role",
    "rope_frequencies",
    "select_topk",
    "sinkhorn",
    "sparse_attention",
    "upcast",
]
