"""The TINY test configuration of MODEL.md §11 and helpers to give modules random weights."""

from __future__ import annotations

import copy

import torch
from torch import nn

from sglang_ds41.config import TextConfig, V41Config

TINY = {
    "architectures": ["DeepseekV41ForCausalLM"], "model_type": "deepseek_v41",
    "bos_token_id": 0, "eos_token_id": 1, "pad_token_id": 2, "image_token_id": 511,
    "text_config": {
        "model_type": "deepseek_v41_text",
        "vocab_size": 512, "hidden_size": 64, "num_hidden_layers": 8,
        "num_attention_heads": 4, "num_key_value_heads": 1, "head_dim": 64,
        "qk_rope_head_dim": 16, "q_lora_rank": 32, "o_lora_rank": 32, "o_groups": 2,
        "hidden_act": "silu", "swiglu_limit": 10.0, "rms_norm_eps": 1e-20,
        "max_position_embeddings": 512, "rope_theta": 10000, "compress_rope_theta": 160000,
        "rope_scaling": {"rope_type": "yarn", "factor": 16, "beta_fast": 32, "beta_slow": 1,
                         "original_max_position_embeddings": 32},
        "n_routed_experts": 8, "n_shared_experts": 1, "num_experts_per_tok": 2,
        "moe_intermediate_size": 32, "scoring_func": "sqrtsoftplus", "topk_method": "noaux_tc",
        "norm_topk_prob": True, "routed_scaling_factor": 1.5,
        "sliding_window": 8,
        "compress_ratios": [0, 0, 2, 2, 1, 1, 1, 1],
        "kv_source_layer_ids": [2, 4],
        "index_source_layer_ids": [2, 4, 6],
        "index_n_heads": 2, "index_head_dim": 32, "index_topk": 4,
        "candidate_source_layer_id": 4, "candidate_topk_blocks": 2, "candidate_block_size": 4,
        "hc_mult": 4, "hc_sinkhorn_iters": 20, "hc_eps": 1e-6,
        "engram_layer_ids": [1, 2], "engram_num_embeddings": [434, 606],
        "engram_max_ngram_size": 4, "engram_vocab_size": 61, "engram_n_heads": 2,
        "engram_head_dim": 32, "engram_pad_token_id": 2, "engram_compressed_vocab_size": 256,
        "num_nextn_predict_layers": 0,
    },
}  # fmt: skip


def tiny_config(**overrides) -> TextConfig:
    data = copy.deepcopy(TINY)
    data["text_config"].update(overrides)
    return V41Config.from_dict(data).text


def randomize_(module: nn.Module, seed: int, std: float = 0.3) -> nn.Module:
    """float64 and fresh random values for every parameter (norm weights around 1)."""
    gen = torch.Generator().manual_seed(seed)
    module.to(torch.float64)
    with torch.no_grad():
        for name, p in module.named_parameters():
            noise = torch.randn(p.shape, generator=gen, dtype=torch.float64) * std
            p.copy_(1 + noise if name.endswith("norm.weight") else noise)
    return module
