"""The V4.1 config: the official file, V4.1 defaults for absent fields, invariants with clear errors."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from sglang_ds41.config import ConfigError, V41Config
from sglang_ds41.errors import Ds41Error

FIXTURES = Path(__file__).parent / "fixtures"
OFFICIAL = json.loads((FIXTURES / "official_config.json").read_text())
TINY = json.loads((FIXTURES / "tiny_config.json").read_text())


def with_text(**changes) -> dict:
    data = copy.deepcopy(OFFICIAL)
    data["text_config"].update(changes)
    return data


def test_official_config_values_match_model_md() -> None:
    config = V41Config.from_dict(OFFICIAL)
    t = config.text
    assert config.architectures == ("DeepseekV41ForCausalLM",)
    assert (config.bos_token_id, config.eos_token_id, config.pad_token_id) == (0, 1, 2)
    assert config.image_token_id == 129264
    assert config.quantization is not None and config.quantization.weight_block_size == (32, 32)
    assert config.quantization.expert_dtype == "fp4"
    assert (t.vocab_size, t.hidden_size, t.num_hidden_layers, t.head_dim) == (129280, 5120, 40, 512)
    assert t.rms_norm_eps == 1e-20
    assert t.compress_rope_theta == 160000.0
    assert t.rope_scaling is not None and t.rope_scaling.original_max_position_embeddings == 65536
    assert len(t.compress_ratios) == 43
    assert t.compress_ratios[:3] == (0, 0, 2) and t.compress_ratios[20] == 1
    assert t.compress_ratios[40:] == (0, 0, 0)
    assert t.engram_layer_ids == (1, 14)
    assert t.engram_num_embeddings == (384_006_168, 384_016_682)
    assert t.engram_compressed_vocab_size == 99092
    assert t.dspark_target_layer_ids == (37, 38, 39)
    assert config.vision is not None and config.vision.min_pixels == 544 * 544
    assert config.vision.max_wh_ratio is None


def test_absent_fields_get_v41_defaults_not_v4_ones() -> None:
    t = V41Config.from_dict(OFFICIAL).text
    assert t.num_hash_layers == 0
    assert (t.n_group, t.topk_group) == (1, 1)
    assert t.first_k_dense_replace == 0
    assert t.gate_temp == 1.0
    assert t.q_head_norm is False
    assert t.hc_pre_from_prev_sublayer is True


def test_fixture_has_every_text_field_of_the_release() -> None:
    # The official file lists all of these; only §1.1's "absent" fields are defaulted.
    absent = {"num_hash_layers", "n_group", "topk_group", "first_k_dense_replace", "gate_temp",
              "q_head_norm", "hc_pre_from_prev_sublayer"}  # fmt: skip
    import dataclasses

    from sglang_ds41.config import TextConfig

    fields = {f.name for f in dataclasses.fields(TextConfig)}
    assert fields - absent == set(OFFICIAL["text_config"])


def test_tiny_config_parses_with_defaults() -> None:
    config = V41Config.from_dict(TINY)
    assert config.quantization is None
    assert config.text.num_nextn_predict_layers == 0
    assert config.text.engram_num_embeddings == (434, 606)


def test_from_file_accepts_a_checkpoint_directory(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps(OFFICIAL))
    assert V41Config.from_file(tmp_path) == V41Config.from_dict(OFFICIAL)


def test_config_error_is_a_ds41_error() -> None:
    assert issubclass(ConfigError, Ds41Error)


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (with_text(engram_num_embeddings=[384006168]), r"len\(text_config.engram_num_embeddings\) = 1"),
        (with_text(hidden_size="5120"), r"text_config.hidden_size: expected an integer"),
        (with_text(hidden_size=True), r"text_config.hidden_size: expected an integer"),
        (with_text(norm_topk_prob=1), r"text_config.norm_topk_prob: expected true or false"),
        (with_text(compress_ratios=[0, 0, 2]), r"len\(text_config.compress_ratios\) = 3, expected .* 43"),
        (with_text(compress_ratios=[0, 0] + [4] * 18 + [1] * 20 + [0, 0, 0]), r"compress_ratios\[2\] = 4"),
        (with_text(index_source_layer_ids=[8, 14, 20, 24]), r"KV source layer 2 .* is not an index source"),
        (with_text(candidate_source_layer_id=24), r"candidate_source_layer_id = 24 is not a KV source"),
        (with_text(kv_source_layer_ids=[8, 14, 20]), r"layer 2 \(compress ratio 2\) has no .*kv_source"),
        (with_text(engram_layer_ids=[14, 1]), r"engram_layer_ids = \[14, 1\] must be strictly increasing"),
        (with_text(engram_layer_ids=[1, 40]), r"engram_layer_ids"),
        (with_text(num_attention_heads=60), r"divisible by text_config.o_groups"),
        ({**OFFICIAL, "model_type": "deepseek_v4"}, r"model_type must be 'deepseek_v41'"),
        ({**OFFICIAL, "image_token_id": 200000}, r"image_token_id = 200000 is outside the vocabulary"),
        ({k: v for k, v in OFFICIAL.items() if k != "text_config"}, r"missing field text_config"),
        ({**OFFICIAL, "vision_config": {"model_type": "deepseek_v41_vision"}}, r"vision_config\.num_hidden"),
    ],
)
def test_invalid_configs_name_the_field(data: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        V41Config.from_dict(data)


def test_missing_required_text_field_is_named() -> None:
    data = copy.deepcopy(OFFICIAL)
    del data["text_config"]["sliding_window"]
    with pytest.raises(ConfigError, match=r"missing required config field text_config\.sliding_window"):
        V41Config.from_dict(data)


def test_unreadable_files_are_clear_errors(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="no config file"):
        V41Config.from_file(tmp_path)
    bad = tmp_path / "config.json"
    bad.write_text("{not json")
    with pytest.raises(ConfigError, match="cannot read JSON"):
        V41Config.from_file(bad)
