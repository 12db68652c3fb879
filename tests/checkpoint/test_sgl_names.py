"""Official names -> SGLang parameter names, per the rules of MODEL.md §8.6.5."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sglang_ds41.checkpoint.manifest import build_manifest
from sglang_ds41.checkpoint.sgl_names import sgl_name
from sglang_ds41.config import V41Config

OFFICIAL = V41Config.from_dict(
    json.loads((Path(__file__).parents[1] / "fixtures" / "official_config.json").read_text())
)


@pytest.fixture(scope="module")
def manifest():
    return build_manifest(OFFICIAL)


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("embed.weight", "model.embed_tokens.weight"),
        ("head.weight", "lm_head.weight"),
        ("norm.weight", "model.norm.weight"),
        ("layers.3.attn.wq_a.scale", "model.layers.3.self_attn.wq_a.weight_scale_inv"),
        ("layers.3.attn.wq_a.weight", "model.layers.3.self_attn.wq_a.weight"),
        ("layers.3.attn_norm.weight", "model.layers.3.input_layernorm.weight"),
        ("layers.3.ffn_norm.weight", "model.layers.3.post_attention_layernorm.weight"),
        ("layers.3.ffn.gate.bias", "model.layers.3.mlp.gate.e_score_correction_bias"),
        ("layers.3.ffn.gate.bias_vl", "model.layers.3.mlp.gate.e_score_correction_bias_vl"),
        ("layers.3.ffn.experts.7.w2.weight", "model.layers.3.mlp.experts.7.down_proj.weight"),
        ("layers.3.ffn.experts.7.w3.scale", "model.layers.3.mlp.experts.7.up_proj.weight_scale_inv"),
        (
            "layers.3.ffn.shared_experts.w1.scale",
            "model.layers.3.mlp.shared_experts.gate_proj.weight_scale_inv",
        ),
        ("layers.14.engram.wkv.scale", "model.layers.14.engram.wkv.weight_scale_inv"),
        ("layers.14.engram.embed.scale", "model.layers.14.engram.embed.scale"),
        ("layers.3.hc_attn_fn", "model.layers.3.hc_attn_fn"),
        ("vision.blocks.0.attn.wqkv.weight", "vision.blocks.0.attn.qkv_proj.weight"),
        ("vision.blocks.0.attn.wo.bias", "vision.blocks.0.attn.proj.bias"),
        ("aligner.w1.weight", "aligner.w1.weight"),
        ("image_newline", "image_newline"),
        ("mtp.2.attn.wkv.weight", "model.layers.42.self_attn.wkv.weight"),
        ("mtp.0.main_proj.scale", "model.layers.40.main_proj.weight_scale_inv"),
    ],
)
def test_rules_of_section_8_6_5(manifest, name, expected):
    assert sgl_name(manifest[name], 40) == expected


def test_mapping_is_one_to_one_over_the_release(manifest):
    names = [sgl_name(spec, 40) for spec in manifest]
    assert len(set(names)) == len(names)
