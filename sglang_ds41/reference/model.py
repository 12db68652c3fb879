"""The V4.1 language model as one plain PyTorch module, assembled from `model/` and `engram/`.

Read it beside MODEL.md §2 (global forward): every line below is one line of that pseudocode.

    e   = embed[ids]; image positions <- precomputed image embeddings       (§2, §7.3)
    R   = broadcast(e, hc); pre = one-hot(copy 0)                           (§3)
    for each layer: [Engram] -> attention site -> MoE site                  (§5, §3.3, §4, §6)
    logits = head(norm(collapse(R, pre)))                                   (§2, §3.3)

Image positions are the ones whose id is `image_token_id` (§7.3: the processor expands every
image to its whole span of that id). They take their input embedding from `image_embeds`
(built with `Transformer.image_span` from the aligner output), are DEAD for Engram (no hash, no
update) and route with `bias_vl`; attention, mHC and positions treat them as ordinary tokens.
The vision tower itself is not part of this module.

Dtypes: the module runs in the dtype it is cast to (float64 for exactness tests, float32 or
bfloat16 otherwise); every op follows the spec's "fp32 math" rule through `model.norm.upcast`,
and the logits are computed in fp32 (float64 in a float64 model).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from sglang_ds41.config import TextConfig, V41Config
from sglang_ds41.engram.hashing import EngramHasher
from sglang_ds41.engram.layer import EngramLayer
from sglang_ds41.errors import Ds41Error
from sglang_ds41.model import (
    Attention,
    AttentionState,
    HyperConnection,
    MoE,
    Published,
    RMSNorm,
    collapse,
    expand,
    first_pre,
    upcast,
)
from sglang_ds41.model.vision import place_image

from .state import RequestState


class Block(nn.Module):
    """One backbone layer (`layers.L.*`): optional Engram, the attention site, the MoE site."""

    def __init__(self, cfg: TextConfig, layer: int):
        super().__init__()
        d, eps = cfg.hidden_size, cfg.rms_norm_eps
        self.layer = layer
        # its table (quantised rows, one rank holds them all) is attached by the loader
        self.engram = EngramLayer(cfg, layer) if layer in cfg.engram_layer_ids else None
        self.hc_attn = HyperConnection(cfg)  # checkpoint: hc_attn_{fn,base,scale}
        self.attn_norm = RMSNorm(d, eps)
        self.attn = Attention(cfg, layer)
        self.hc_ffn = HyperConnection(cfg)  # checkpoint: hc_ffn_{fn,base,scale}
        self.ffn_norm = RMSNorm(d, eps)
        self.ffn = MoE(cfg)

    def forward(
        self,
        r: torch.Tensor,
        pre: torch.Tensor,
        positions: torch.Tensor,
        state: AttentionState,
        published: Published,
        is_image: torch.Tensor,
        engram_ids: torch.Tensor | None,
    ) -> tuple[torch.Tensor, torch.Tensor, AttentionState]:
        """R [T, hc, D], pre [T, hc] (from the previous site) -> (R, pre of the MoE site, state).

        `engram_ids [T, n_columns]`: this layer's table rows per token (Engram layers only)."""
        if self.engram is not None:
            r = self.engram(r, engram_ids, is_image)  # rewrites R, keeps pre (§5.6)
        coeffs = self.hc_attn(r)  # from the stream entering the site
        y, state = self.attn(self.attn_norm(collapse(r, pre)), positions, state, published)
        r = expand(r, y, coeffs.post, coeffs.comb)
        pre = coeffs.pre
        coeffs = self.hc_ffn(r)
        y = self.ffn(self.ffn_norm(collapse(r, pre)), is_image)
        r = expand(r, y, coeffs.post, coeffs.comb)
        return r, coeffs.pre, state


class Transformer(nn.Module):
    """`DeepseekV41ForCausalLM` without vision tower and DSpark; parameter names follow the
    checkpoint (`embed`, `layers.L.attn.wq_a`, ..., `norm`, `head`; see `weights.py`)."""

    def __init__(self, config: V41Config, hasher: EngramHasher):
        super().__init__()
        t = config.text
        if t.num_hash_layers != 0 or t.q_head_norm or not t.hc_pre_from_prev_sublayer:
            raise Ds41Error(
                "reference model: only V4.1 semantics are implemented (num_hash_layers=0, "
                f"q_head_norm=False, hc_pre_from_prev_sublayer=True), got num_hash_layers="
                f"{t.num_hash_layers}, q_head_norm={t.q_head_norm}, "
                f"hc_pre_from_prev_sublayer={t.hc_pre_from_prev_sublayer}"
            )
        self.config, self.text = config, t
        self.hasher = hasher
        self.image_token_id = config.image_token_id
        d = t.hidden_size
        self.embed = nn.Embedding(t.vocab_size, d)
        self.image_start = nn.Parameter(torch.zeros(d))
        self.image_newline = nn.Parameter(torch.zeros(d))
        self.image_end = nn.Parameter(torch.zeros(d))
        self.layers = nn.ModuleList(Block(t, layer) for layer in range(t.num_hidden_layers))
        self.norm = RMSNorm(d, t.rms_norm_eps)
        self.head = nn.Linear(d, t.vocab_size, bias=False)

    @property
    def dtype(self) -> torch.dtype:
        return self.embed.weight.dtype

    @property
    def device(self) -> torch.device:
        return self.embed.weight.device

    def new_state(self) -> RequestState:
        return RequestState.new(self.text, self.hasher, self.dtype, self.device)

    def image_span(self, cells: torch.Tensor) -> torch.Tensor:
        """Aligner output [n_h, n_w, D] -> the span's input embeddings [n_h * (n_w + 1) + 2, D]:
        START, each row of cells followed by NEWLINE, END (§7.3)."""
        return place_image(cells, self.image_start, self.image_newline, self.image_end)

    @torch.no_grad()
    def forward(
        self, input_ids: torch.Tensor, state: RequestState, image_embeds: torch.Tensor | None = None
    ) -> torch.Tensor:
        """The next chunk of one request: ids [T] -> logits [T, vocab]; advances `state`.

        `image_embeds [n, D]`: input embeddings of this chunk's n image positions, in order
        (a chunk may hold part of an image span; pass the matching rows)."""
        t = input_ids.shape[0]
        if input_ids.ndim != 1 or t == 0:
            raise Ds41Error(
                f"reference forward: expected a non-empty 1-D tensor of ids, got {tuple(input_ids.shape)}"
            )
        positions = state.position + torch.arange(t, device=input_ids.device)  # [T], absolute
        is_image = input_ids == self.image_token_id  # [T]
        e = self.embed_tokens(input_ids, is_image, image_embeds)  # [T, D]
        r = e[:, None, :].expand(t, self.text.hc_mult, e.shape[-1]).contiguous()  # [T, hc, D]
        engram_ids, history = self.hasher.extend(state.engram_history, input_ids, torch.tensor([t]))
        pre = first_pre(r)  # [T, hc]: no previous site yet
        published = Published()
        attention = []
        for block, layer_state in zip(self.layers, state.attention, strict=True):
            ids = None
            if block.engram is not None:
                ids = engram_ids[:, self.hasher.layout.index_of(block.layer)]  # [T, n_columns]
            r, pre, layer_state = block(r, pre, positions, layer_state, published, is_image, ids)
            attention.append(layer_state)
        h = self.norm(collapse(r, pre))  # final collapse with the last MoE site's pre
        logits = F.linear(upcast(h), upcast(self.head.weight))  # [T, vocab]
        state.attention, state.engram_history, state.position = attention, history, state.position + t
        return logits

    def embed_tokens(
        self, input_ids: torch.Tensor, is_image: torch.Tensor, image_embeds: torch.Tensor | None
    ) -> torch.Tensor:
        """Token embeddings [T, D], image positions replaced by `image_embeds` (no scaling)."""
        e = self.embed(input_ids)
        n_image = int(is_image.sum())
        given = 0 if image_embeds is None else image_embeds.shape[0]
        if given != n_image or (image_embeds is not None and image_embeds.shape[-1] != e.shape[-1]):
            shape = None if image_embeds is None else tuple(image_embeds.shape)
            raise Ds41Error(
                f"reference forward: the chunk has {n_image} image positions (id {self.image_token_id}), "
                f"expected image_embeds of shape ({n_image}, {e.shape[-1]}), got {shape}"
            )
        if n_image:
            e[is_image] = image_embeds.to(e.dtype)
        return e
