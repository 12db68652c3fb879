"""The manifest of the OFFICIAL config against the released numbers (MODEL.md §8.3, §8.6, §9)."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from sglang_ds41.checkpoint.manifest import build_manifest
from sglang_ds41.config import ConfigError, V41Config

OFFICIAL = json.loads((Path(__file__).parents[1] / "fixtures" / "official_config.json").read_text())

# NVIDIA's config.json quantization block (§1.2).
NV_QUANT = {
    "quant_algo": "MIXED_PRECISION",
    "moe_quant_algo": "NVFP4",
    "group_size": 16,
    "kv_cache_quant_algo": None,
    "ignore": ["*.attn.*", "*.ffn.shared_experts.*", "head", "mtp.*"],
    "quantized_layers": {
        f"layers.{i}.ffn.experts": {"quant_algo": "NVFP4", "group_size": 16} for i in range(40)
    },
}


def official(**quant) -> V41Config:
    data = copy.deepcopy(OFFICIAL)
    data["quantization_config"].update(quant)
    return V41Config.from_dict(data)


@pytest.fixture(scope="module")
def base():
    return build_manifest(official())


def test_base_release_has_the_indexed_tensor_count_and_total_size(base):
    assert base.variant == "base" and base.engram_format == "fp8"
    assert len(base) == 96_085
    assert base.total_bytes == 510_286_023_000


def test_base_release_dtype_set_is_the_census_one(base):
    assert {t.dtype for t in base} == {"BF16", "F32", "F8_E4M3", "F8_E8M0", "I8"}


def test_parameter_counts_match_section_9_1(base):
    groups = base.parameters_by_group()
    assert groups["routed_experts"] == 543_581_798_400
    assert groups["backbone"] == 8_299_052_144
    assert groups["backbone"] + groups["routed_experts"] == 551_880_850_544
    assert groups["engram_tables"] == 196_613_849_600
    assert groups["dspark"] == 14_225_362_530
    assert groups["vision"] == 485_253_120
    assert base.parameters == 763_205_315_794


def test_engram_tables_take_188_83_gib_in_fp8(base):
    assert base.bytes_by_format()["engram_fp8"] == 768_022_850 * 264 == 202_758_032_400


def test_fp8_linear_count_is_355(base):
    assert sum(1 for t in base if t.format == "fp8" and t.role == "weight") == 355


@pytest.mark.parametrize(
    ("name", "dtype", "shape"),
    [
        ("embed.weight", "BF16", (129280, 5120)),
        ("layers.0.attn.wo_a.scale", "F8_E8M0", (256, 128)),
        ("layers.7.attn.wq_b.weight", "F8_E4M3", (32768, 1280)),
        ("layers.39.ffn.shared_experts.w2.scale", "F8_E8M0", (160, 72)),
        ("layers.5.ffn.experts.383.w2.weight", "I8", (5120, 1152)),
        ("layers.5.ffn.experts.0.w1.scale", "F8_E8M0", (2304, 160)),
        ("layers.3.hc_ffn_fn", "F32", (24, 20480)),
        ("layers.14.engram.embed.weight", "F8_E4M3", (384016682, 256)),
        ("layers.1.engram.embed.scale", "F8_E8M0", (384006168, 8)),
        ("layers.14.engram.wkv.scale", "F8_E8M0", (800, 192)),
        ("layers.1.engram.q_weight", "BF16", (4, 5120)),
        ("layers.20.attn.compressor.wkv.weight", "BF16", (512, 5120)),
        ("layers.8.attn.compressor.wgate.weight", "BF16", (512, 5120)),
        ("layers.24.attn.indexer.wq_b.scale", "F8_E8M0", (128, 40)),
        ("layers.20.attn.indexer.k_norm.weight", "BF16", (128,)),
        ("mtp.0.main_proj.scale", "F8_E8M0", (160, 480)),
        ("mtp.1.ffn.gate.weight", "BF16", (128, 5120)),
        ("mtp.2.ffn.experts.127.w3.weight", "I8", (2304, 2560)),
        ("mtp.2.markov_head.embed.weight", "BF16", (129280, 256)),
        ("mtp.2.confidence_head.proj.weight", "BF16", (1, 5376)),
        ("vision.blocks.31.mlp.w1.weight", "BF16", (5632, 1024)),
        ("vision.patch_embed.proj.weight", "BF16", (1024, 588)),
        ("aligner.w1.weight", "BF16", (5120, 9216)),
        ("image_newline", "BF16", (5120,)),
    ],
)
def test_official_tensor_table_entries(base, name, dtype, shape):
    spec = base[name]
    assert (spec.dtype, spec.shape) == (dtype, shape)


@pytest.mark.parametrize(
    "name",
    [
        "layers.20.attn.compressor.wgate.weight",  # ratio 1 has no gate
        "layers.24.attn.indexer.wk.weight",  # Reindex borrows keys
        "layers.3.attn.indexer.wq_b.weight",  # Reuse has no indexer
        "layers.2.engram.embed.weight",
        "layers.0.attn.compressor.wkv.weight",
        "hc_head_fn",
        "layers.0.ffn.gate.tid2eid",
        "mtp.1.main_proj.weight",
        "mtp.3.attn.wkv.weight",
        "layers.0.ffn.experts.384.w1.weight",
    ],
)
def test_absent_tensors_are_not_expected(base, name):
    assert name not in base


def test_nvidia_nvfp4_release_numbers_of_section_8_3():
    m = build_manifest(official(**NV_QUANT))
    assert m.variant == "nvfp4"
    assert len(m) == 188_245
    assert m.total_bytes == 527_273_322_840
    w1 = m["layers.0.ffn.experts.0.w1.weight_scale"]
    assert (w1.dtype, w1.shape) == ("F8_E4M3", (2304, 320))
    assert m["layers.39.ffn.experts.383.w2.weight"].shape == (5120, 1152)
    assert m["layers.39.ffn.experts.383.w2.input_scale"].shape == ()
    # DSpark experts stay MXFP4 (not in quantized_layers).
    assert m["mtp.0.ffn.experts.0.w1.weight"].format == "mxfp4"


def test_nvfp4_without_quantized_layers_converts_backbone_experts_only():
    quant = {k: v for k, v in NV_QUANT.items() if k != "quantized_layers"}
    m = build_manifest(official(**quant))
    assert m.total_bytes == 527_273_322_840


def test_mxfp4_engram_tables_take_136_bytes_per_row():
    m = build_manifest(official(engram_embed_quant="mxfp4", engram_embed_block_size=32))
    assert m.engram_format == "mxfp4"
    assert m.bytes_by_format()["engram_mxfp4"] == 104_451_107_600
    spec = m["layers.1.engram.embed.weight"]
    assert (spec.dtype, spec.shape) == ("U8", (384006168, 128))
    assert m.total_bytes == 510_286_023_000 - 768_022_850 * (264 - 136)


def test_nvfp4_engram_tables_take_144_bytes_per_row_and_a_global_scale():
    # MODEL.md §9.2: NVFP4 tables 768,022,850 rows x 144 B = 110,595,290,400 B; + one F32 per table
    m = build_manifest(official(engram_embed_quant="nvfp4", engram_embed_block_size=16))
    assert m.engram_formats == {1: "nvfp4", 14: "nvfp4"}
    assert m.bytes_by_format()["engram_nvfp4"] == 110_595_290_400 + 2 * 4
    expected = [
        ("layers.1.engram.embed.weight", "U8", (384006168, 128), "weight"),
        ("layers.1.engram.embed.weight_scale", "F8_E4M3", (384006168, 16), "weight_scale"),
        ("layers.1.engram.embed.weight_scale_2", "F32", (), "weight_scale_2"),
    ]
    for name, dtype, shape, role in expected:
        assert (m[name].dtype, m[name].shape, m[name].role) == (dtype, shape, role)
    assert "layers.1.engram.embed.scale" not in m
    assert m["layers.1.engram.embed.weight"].accepts("I8", (384006168, 128))  # same bytes as U8
    assert m["layers.1.engram.embed.weight_scale_2"].accepts("F32", (1,))
    assert m.parameters_by_group()["engram_tables"] == 196_613_849_600  # codes count 1 each


def test_mxfp4_engram_on_one_layer_only_is_mixed():
    m = build_manifest(official(engram_embed_quant="mxfp4", engram_embed_layers=[14]))
    assert m.engram_formats == {1: "fp8", 14: "mxfp4"}
    assert m.engram_format.startswith("mixed")


@pytest.mark.parametrize(
    ("quant", "needle"),
    [
        ({"engram_embed_quant": "int4"}, "engram_embed_quant"),
        ({"engram_embed_quant": "mxfp4", "engram_embed_block_size": 16}, "engram_embed_block_size"),
        ({"engram_embed_quant": "nvfp4", "engram_embed_block_size": 32}, "32, expected 16 for"),
        ({"engram_embed_quant": "mxfp4", "engram_embed_layers": [2]}, "engram_embed_layers"),
        ({"weight_block_size": [128, 128]}, "weight_block_size"),
        ({**NV_QUANT, "quantized_layers": {"layers.40.ffn.experts": {}}}, "layers.40.ffn.experts"),
    ],
)
def test_contradictory_quantization_config_is_refused(quant, needle):
    with pytest.raises(ConfigError, match=needle):
        build_manifest(official(**quant))


def test_engram_rows_that_disagree_with_the_prime_layout_are_refused():
    data = copy.deepcopy(OFFICIAL)
    data["text_config"]["engram_num_embeddings"] = [384006168, 384016683]
    with pytest.raises(ConfigError, match="engram_num_embeddings"):
        build_manifest(V41Config.from_dict(data))
