"""The speed benchmark's peers: a plain Llama-style model of a V4.1 checkpoint's dimensions.

`LlamaPeer` is "the same work in PyTorch": eager, no server, a preallocated KV cache, float32,
the V4.1 text config's hidden size, layers, query heads x head_dim, one shared KV head (V4.1's
single K=V latent is one head too), the real 129,280-id vocabulary and its output head, and a
SwiGLU MLP as wide as the experts a token runs (shared + routed: `moe_intermediate_size x
(n_shared_experts + num_experts_per_tok)`). What V4.1 adds on top (mHC's 4 residual copies and
Sinkhorn, the compressor, indexer and top-k, Engram, routing) is what our step must pay for.

`write_hf_llama` writes the same model as a Hugging Face `LlamaForCausalLM` checkpoint (config,
safetensors, the V4.1 tokenizer) for upstream SGLang to serve through its own Llama code.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from sglang_ds41.config import TextConfig


@dataclass(frozen=True)
class PeerDims:
    vocab: int
    hidden: int
    layers: int
    heads: int
    head_dim: int
    intermediate: int
    rope_theta: float = 10000.0
    eps: float = 1e-6

    @classmethod
    def of(cls, t: TextConfig) -> PeerDims:
        width = t.moe_intermediate_size * (t.n_shared_experts + t.num_experts_per_tok)
        return cls(t.vocab_size, t.hidden_size, t.num_hidden_layers, t.num_attention_heads, t.head_dim, width)


def _rope(x: torch.Tensor, positions: torch.Tensor, theta: float) -> torch.Tensor:
    """Rotate-half RoPE over the whole head: x [T, heads, Dh], positions [T]."""
    half = x.shape[-1] // 2
    freqs = theta ** (-torch.arange(half, dtype=torch.float32) / half)
    angles = positions.float()[:, None] * freqs  # [T, half]
    cos, sin = angles.cos()[:, None, :], angles.sin()[:, None, :]
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)


class _Layer(nn.Module):
    def __init__(self, d: PeerDims):
        super().__init__()
        self.heads, self.head_dim, self.eps, self.theta = d.heads, d.head_dim, d.eps, d.rope_theta
        self.input_layernorm = nn.Parameter(torch.ones(d.hidden))
        self.q_proj = nn.Linear(d.hidden, d.heads * d.head_dim, bias=False)
        self.k_proj = nn.Linear(d.hidden, d.head_dim, bias=False)
        self.v_proj = nn.Linear(d.hidden, d.head_dim, bias=False)
        self.o_proj = nn.Linear(d.heads * d.head_dim, d.hidden, bias=False)
        self.post_attention_layernorm = nn.Parameter(torch.ones(d.hidden))
        self.gate_proj = nn.Linear(d.hidden, d.intermediate, bias=False)
        self.up_proj = nn.Linear(d.hidden, d.intermediate, bias=False)
        self.down_proj = nn.Linear(d.intermediate, d.hidden, bias=False)

    def forward(self, x: torch.Tensor, positions: torch.Tensor, k_cache, v_cache, start: int) -> torch.Tensor:
        """x [B, T, D] of B requests at positions start..start+T-1; caches [B, max, Dh]."""
        b, t, _ = x.shape
        h = F.rms_norm(x, (x.shape[-1],), self.input_layernorm, self.eps)
        q = _rope(self.q_proj(h).view(b * t, self.heads, -1), positions.repeat(b), self.theta)
        k = _rope(self.k_proj(h).view(b * t, 1, -1), positions.repeat(b), self.theta)
        k_cache[:, start : start + t] = k.view(b, t, -1)
        v_cache[:, start : start + t] = self.v_proj(h)
        keys, values = k_cache[:, : start + t], v_cache[:, : start + t]  # [B, S, Dh]
        if t == 1:  # decode: one shared KV head, so two batched GEMMs over the heads
            scores = q.view(b, self.heads, -1) @ keys.transpose(1, 2) * self.head_dim**-0.5
            o = torch.softmax(scores, dim=-1) @ values  # [B, H, Dh]
        else:  # prefill: SDPA (its causal kernel from position 0, else a mask over the cache)
            mask = None if start == 0 else torch.ones(t, start + t, dtype=torch.bool).tril(start)
            o = F.scaled_dot_product_attention(
                q.view(b, t, self.heads, -1).transpose(1, 2), keys[:, None], values[:, None],
                attn_mask=mask, is_causal=start == 0, enable_gqa=True,
            ).transpose(1, 2)  # fmt: skip
        x = x + self.o_proj(o.reshape(b, t, -1))
        h = F.rms_norm(x, (x.shape[-1],), self.post_attention_layernorm, self.eps)
        return x + self.down_proj(F.silu(self.gate_proj(h)) * self.up_proj(h))


class LlamaPeer(nn.Module):
    """Eager Llama with a KV cache for B requests of up to `max_len` tokens each."""

    def __init__(self, d: PeerDims, seed: int = 0):
        super().__init__()
        torch.manual_seed(seed)
        self.dims = d
        self.embed_tokens = nn.Embedding(d.vocab, d.hidden)
        self.layers = nn.ModuleList(_Layer(d) for _ in range(d.layers))
        self.norm = nn.Parameter(torch.ones(d.hidden))
        self.lm_head = nn.Linear(d.hidden, d.vocab, bias=False)
        with torch.no_grad():
            for p in self.parameters():
                if p.dim() == 2:
                    p.normal_(0, p.shape[1] ** -0.5)
        self.requires_grad_(False)
        self.caches: list[tuple[torch.Tensor, torch.Tensor]] = []

    def reset(self, batch: int, max_len: int) -> None:
        shape = (batch, max_len, self.dims.head_dim)
        self.caches = [(torch.zeros(shape), torch.zeros(shape)) for _ in self.layers]

    @torch.no_grad()
    def forward(self, ids: torch.Tensor, start: int) -> torch.Tensor:
        """ids [B, T] at positions start.. of each request -> next-token logits [B, vocab]."""
        t = ids.shape[1]
        positions = torch.arange(start, start + t)
        x = self.embed_tokens(ids)
        for layer, (k, v) in zip(self.layers, self.caches, strict=True):
            x = layer(x, positions, k, v, start)
        h = F.rms_norm(x[:, -1], (x.shape[-1],), self.norm, self.dims.eps)
        return self.lm_head(h)


def write_hf_llama(peer: LlamaPeer, out: Path, tokenizer_dir: Path, max_positions: int) -> Path:
    """`peer` as a Hugging Face LlamaForCausalLM checkpoint directory (float32 safetensors)."""
    from safetensors.torch import save_file

    d = peer.dims
    out.mkdir(parents=True, exist_ok=True)
    tensors = {"model.embed_tokens.weight": peer.embed_tokens.weight, "model.norm.weight": peer.norm}
    tensors["lm_head.weight"] = peer.lm_head.weight
    for i, layer in enumerate(peer.layers):
        p = f"model.layers.{i}"
        tensors[f"{p}.input_layernorm.weight"] = layer.input_layernorm
        tensors[f"{p}.post_attention_layernorm.weight"] = layer.post_attention_layernorm
        for name in ("q_proj", "k_proj", "v_proj", "o_proj"):
            tensors[f"{p}.self_attn.{name}.weight"] = getattr(layer, name).weight
        for name in ("gate_proj", "up_proj", "down_proj"):
            tensors[f"{p}.mlp.{name}.weight"] = getattr(layer, name).weight
    save_file({k: v.detach().contiguous() for k, v in tensors.items()}, str(out / "model.safetensors"))
    config = {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "torch_dtype": "float32",
        "vocab_size": d.vocab, "hidden_size": d.hidden, "intermediate_size": d.intermediate,
        "num_hidden_layers": d.layers, "num_attention_heads": d.heads, "num_key_value_heads": 1,
        "head_dim": d.head_dim, "hidden_act": "silu", "rms_norm_eps": d.eps, "rope_theta": d.rope_theta,
        "max_position_embeddings": max_positions, "tie_word_embeddings": False,
        "bos_token_id": 0, "eos_token_id": 1, "attention_bias": False, "mlp_bias": False,
    }  # fmt: skip
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    for file in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copyfile(tokenizer_dir / file, out / file)
    return out
