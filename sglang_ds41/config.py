"""The DeepSeek-V4.1 `config.json` as typed, validated, frozen objects (MODEL.md §1).

The released file is nested: root identity and `quantization_config` at the root, the language
model under `text_config`, the ViT under `vision_config`. Fields the release omits get the
V4.1 values of MODEL.md §1.1 (never SGL's V4-era dataclass defaults). Every problem is a
`Ds41Error` naming the field, so a bad config fails at load time instead of deep in a forward.
"""

from __future__ import annotations

import dataclasses
import json
import types
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sglang_ds41.errors import Ds41Error

MODEL_TYPE = "deepseek_v41"
TEXT_MODEL_TYPE = "deepseek_v41_text"
VISION_MODEL_TYPE = "deepseek_v41_vision"


class ConfigError(Ds41Error):
    """A config field is missing, mistyped, or breaks an invariant of the architecture."""


@dataclass(frozen=True)
class RopeScaling:
    """YaRN numbers; applied only to compressed (ratio 1/2) layers (§4.2)."""

    rope_type: str
    factor: float
    beta_fast: float
    beta_slow: float
    original_max_position_embeddings: int


@dataclass(frozen=True)
class QuantizationConfig:
    """Root `quantization_config`: FP8 32x32 blocks + MXFP4 experts, or the NVIDIA NVFP4 mix (§1.2)."""

    quant_method: str
    activation_scheme: str = "dynamic"
    weight_block_size: tuple[int, ...] = (32, 32)
    scale_fmt: str = "ue8m0"
    expert_dtype: str = "fp4"
    # NVIDIA ModelOpt release only (§1.2); absent in the base release.
    quant_algo: str | None = None
    moe_quant_algo: str | None = None
    group_size: int | None = None
    kv_cache_quant_algo: str | None = None
    ignore: tuple[str, ...] = ()
    quantized_layers: Mapping[str, Any] | None = None
    config_groups: Mapping[str, Any] | None = None
    producer: Mapping[str, Any] | None = None
    # MXFP4 Engram tables (MODEL.md §8.4); absent or "fp8" = the official FP8 tables.
    engram_embed_quant: str | None = None
    engram_embed_block_size: int | None = None
    engram_embed_layers: tuple[int, ...] | None = None


@dataclass(frozen=True)
class TextConfig:
    """`text_config`: the 40-layer MoE decoder, its attention schedule, Engram and DSpark."""

    model_type: str
    vocab_size: int
    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    qk_rope_head_dim: int
    q_lora_rank: int
    o_lora_rank: int
    o_groups: int
    hidden_act: str
    swiglu_limit: float
    rms_norm_eps: float
    max_position_embeddings: int
    rope_theta: float
    rope_scaling: RopeScaling | None
    compress_rope_theta: float
    n_routed_experts: int
    n_shared_experts: int
    num_experts_per_tok: int
    moe_intermediate_size: int
    scoring_func: str
    topk_method: str
    norm_topk_prob: bool
    routed_scaling_factor: float
    sliding_window: int
    compress_ratios: tuple[int, ...]
    kv_source_layer_ids: tuple[int, ...]
    index_source_layer_ids: tuple[int, ...]
    index_n_heads: int
    index_head_dim: int
    index_topk: int
    candidate_source_layer_id: int
    candidate_topk_blocks: int
    candidate_block_size: int
    hc_mult: int
    hc_sinkhorn_iters: int
    hc_eps: float
    engram_layer_ids: tuple[int, ...]
    engram_num_embeddings: tuple[int, ...]
    engram_max_ngram_size: int
    engram_vocab_size: int
    engram_n_heads: int
    engram_head_dim: int
    engram_pad_token_id: int
    engram_compressed_vocab_size: int
    num_nextn_predict_layers: int
    # Present in the release; defaults = released values, for hand-written (test) configs.
    attention_bias: bool = False
    attention_dropout: float = 0.0
    initializer_range: float = 0.02
    use_cache: bool = True
    tie_word_embeddings: bool = False
    dspark_block_size: int = 5
    dspark_noise_token_id: int = 128799
    dspark_target_layer_ids: tuple[int, ...] = ()
    dspark_markov_rank: int = 256
    dspark_n_routed_experts: int = 128
    dspark_num_experts_per_tok: int = 3
    # Absent from the release: V4.1 values (§1.1), not SGL's V4 defaults.
    num_hash_layers: int = 0
    n_group: int = 1
    topk_group: int = 1
    first_k_dense_replace: int = 0
    gate_temp: float = 1.0
    q_head_norm: bool = False
    hc_pre_from_prev_sublayer: bool = True


@dataclass(frozen=True)
class VisionConfig:
    """`vision_config`: the ViT and its image preprocessing (§7)."""

    model_type: str
    num_hidden_layers: int
    hidden_size: int
    num_attention_heads: int
    intermediate_size: int
    patch_size: int
    rope_theta: float
    downsample_ratio: int
    max_image_tokens: int
    min_pixels: int
    max_wh_ratio: float | None = None


@dataclass(frozen=True)
class V41Config:
    """The whole `config.json`."""

    text: TextConfig
    vision: VisionConfig | None
    quantization: QuantizationConfig | None
    architectures: tuple[str, ...]
    model_type: str
    bos_token_id: int
    eos_token_id: int
    pad_token_id: int
    image_token_id: int
    dtype: str = "bfloat16"
    transformers_version: str | None = None
    source: str = field(default="<dict>", compare=False)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], source: str = "<dict>") -> V41Config:
        """Parse the nested HF form; raises `ConfigError` naming the offending field."""
        if not isinstance(data, Mapping):
            raise ConfigError(f"{source}: config must be a JSON object, got {type(data).__name__}")
        if "text_config" not in data:
            raise ConfigError(
                f"{source}: missing field text_config (expected the nested V4.1 config.json, "
                "not a flattened or reference-style inference/config.json)"
            )
        root = dict(data)
        text = _build(TextConfig, root.pop("text_config"), "text_config", source)
        vision_data = root.pop("vision_config", None)
        vision = None if vision_data is None else _build(VisionConfig, vision_data, "vision_config", source)
        quant_data = root.pop("quantization_config", None)
        quant = (
            None
            if quant_data is None
            else _build(QuantizationConfig, quant_data, "quantization_config", source)
        )
        parts = {"text": text, "vision": vision, "quantization": quant, "source": source}
        config = _build(cls, root, "", source, extra=parts)
        _validate(config)
        return config

    @classmethod
    def from_file(cls, path: str | Path) -> V41Config:
        """Load a `config.json`, or the `config.json` inside a checkpoint directory."""
        path = Path(path)
        file = path / "config.json" if path.is_dir() else path
        if not file.is_file():
            raise ConfigError(f"no config file at {file}")
        try:
            data = json.loads(file.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
            raise ConfigError(f"{file}: cannot read JSON config: {error}") from None
        return cls.from_dict(data, source=str(file))


# --- parsing -----------------------------------------------------------------------------------


def _build(
    cls: type, data: Any, prefix: str, source: str, extra: Mapping[str, Any] | None = None
) -> Any:
    where = prefix or "config root"
    if not isinstance(data, Mapping):
        raise ConfigError(f"{source}: {where} must be a JSON object, got {type(data).__name__}")
    hints = typing.get_type_hints(cls)
    values: dict[str, Any] = dict(extra or {})
    for f in dataclasses.fields(cls):
        if f.name in values:
            continue
        name = f"{prefix}.{f.name}" if prefix else f.name
        if f.name in data:
            values[f.name] = _convert(data[f.name], hints[f.name], name, source)
        elif f.default is dataclasses.MISSING:
            raise ConfigError(f"{source}: missing required config field {name}")
    return cls(**values)


def _convert(value: Any, hint: Any, name: str, source: str) -> Any:
    def bad(expected: str) -> ConfigError:
        return ConfigError(f"{source}: config field {name}: expected {expected}, got {value!r}")

    origin = typing.get_origin(hint)
    args = typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        (inner,) = [a for a in args if a is not type(None)]
        return _convert(value, inner, name, source)
    if hint is bool:
        if not isinstance(value, bool):
            raise bad("true or false")
        return value
    if hint is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise bad("an integer")
        return value
    if hint is float:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise bad("a number")
        return float(value)
    if hint is str:
        if not isinstance(value, str):
            raise bad("a string")
        return value
    if origin is tuple:
        if not isinstance(value, list | tuple):
            raise bad("a list")
        return tuple(_convert(v, args[0], f"{name}[{i}]", source) for i, v in enumerate(value))
    if origin is Mapping:
        if not isinstance(value, Mapping):
            raise bad("a JSON object")
        return types.MappingProxyType(dict(value))
    if dataclasses.is_dataclass(hint):
        return _build(hint, value, name, source)
    raise TypeError(f"unsupported config field type {hint!r} for {name}")  # programming error


# --- invariants --------------------------------------------------------------------------------


_POSITIVE_TEXT_FIELDS = (
    "vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
    "head_dim", "q_lora_rank", "o_lora_rank", "o_groups", "n_routed_experts", "num_experts_per_tok",
    "moe_intermediate_size", "sliding_window", "index_n_heads", "index_head_dim", "index_topk",
    "candidate_topk_blocks", "candidate_block_size", "hc_mult", "hc_sinkhorn_iters", "engram_n_heads",
    "engram_head_dim", "engram_compressed_vocab_size",
)  # fmt: skip
_LAYER_ID_LIST_FIELDS = (
    "kv_source_layer_ids", "index_source_layer_ids", "engram_layer_ids", "dspark_target_layer_ids",
)  # fmt: skip


def _validate(config: V41Config) -> None:
    where = config.source
    problems: list[str] = []

    def check(ok: bool, message: str) -> None:
        if not ok:
            problems.append(message)

    check(config.model_type == MODEL_TYPE, f"model_type must be {MODEL_TYPE!r}, got {config.model_type!r}")
    t = config.text
    check(
        t.model_type == TEXT_MODEL_TYPE,
        f"text_config.model_type must be {TEXT_MODEL_TYPE!r}, got {t.model_type!r}",
    )
    if config.vision is not None:
        check(
            config.vision.model_type == VISION_MODEL_TYPE,
            f"vision_config.model_type must be {VISION_MODEL_TYPE!r}, got {config.vision.model_type!r}",
        )
    for key in ("bos_token_id", "eos_token_id", "pad_token_id", "image_token_id"):
        value = getattr(config, key)
        check(0 <= value < t.vocab_size, f"{key} = {value} is outside the vocabulary [0, {t.vocab_size})")

    for key in _POSITIVE_TEXT_FIELDS:
        check(getattr(t, key) > 0, f"text_config.{key} must be > 0, got {getattr(t, key)}")
    check(t.rms_norm_eps > 0, f"text_config.rms_norm_eps must be > 0, got {t.rms_norm_eps}")
    check(
        0 < t.qk_rope_head_dim < t.head_dim and t.qk_rope_head_dim % 2 == 0,
        f"text_config.qk_rope_head_dim must be even and in (0, head_dim={t.head_dim}), "
        f"got {t.qk_rope_head_dim}",
    )
    check(
        t.num_attention_heads % t.o_groups == 0,
        f"text_config.num_attention_heads ({t.num_attention_heads}) must be divisible by "
        f"text_config.o_groups ({t.o_groups})",
    )
    check(
        t.num_experts_per_tok <= t.n_routed_experts,
        f"text_config.num_experts_per_tok ({t.num_experts_per_tok}) exceeds "
        f"text_config.n_routed_experts ({t.n_routed_experts})",
    )
    check(t.num_nextn_predict_layers >= 0, "text_config.num_nextn_predict_layers must be >= 0")

    n_layers = t.num_hidden_layers
    expected_ratios = n_layers + t.num_nextn_predict_layers
    check(
        len(t.compress_ratios) == expected_ratios,
        f"len(text_config.compress_ratios) = {len(t.compress_ratios)}, expected num_hidden_layers + "
        f"num_nextn_predict_layers = {expected_ratios}",
    )
    for i, ratio in enumerate(t.compress_ratios):
        check(ratio in (0, 1, 2), f"text_config.compress_ratios[{i}] = {ratio}, expected 0, 1 or 2")
    for i in range(n_layers, len(t.compress_ratios)):
        check(t.compress_ratios[i] == 0, f"text_config.compress_ratios[{i}] (a DSpark stage) must be 0")
    ratios = t.compress_ratios[:n_layers]

    for key in _LAYER_ID_LIST_FIELDS:
        ids = getattr(t, key)
        check(
            list(ids) == sorted(set(ids)) and all(0 <= i < n_layers for i in ids),
            f"text_config.{key} = {list(ids)} must be strictly increasing layer ids in [0, {n_layers})",
        )
    if problems:
        raise ConfigError(f"{where}: invalid config: " + "; ".join(problems))

    # Attention schedule (§1.3), only meaningful once the id lists are well-formed.
    kv, index = set(t.kv_source_layer_ids), set(t.index_source_layer_ids)
    for layer in sorted(kv - index):
        problems.append(f"KV source layer {layer} (text_config.kv_source_layer_ids) is not an index source")
    for layer in sorted(kv | index):
        if ratios[layer] == 0:
            problems.append(
                f"layer {layer} is a KV/index source but text_config.compress_ratios[{layer}] = 0"
            )
    for layer, ratio in enumerate(ratios):
        if ratio == 0:
            continue
        run_start = layer
        while run_start > 0 and ratios[run_start - 1] == ratio:
            run_start -= 1
        for key, sources in (("kv_source_layer_ids", kv), ("index_source_layer_ids", index)):
            if not any(run_start <= s <= layer for s in sources):
                problems.append(
                    f"layer {layer} (compress ratio {ratio}) has no entry of text_config.{key} at or "
                    f"before it within its ratio-{ratio} run starting at layer {run_start}"
                )
    check(
        t.candidate_source_layer_id in kv,
        f"text_config.candidate_source_layer_id = {t.candidate_source_layer_id} is not a KV source "
        f"{sorted(kv)}",
    )

    # Engram (§5).
    check(
        len(t.engram_num_embeddings) == len(t.engram_layer_ids),
        f"len(text_config.engram_num_embeddings) = {len(t.engram_num_embeddings)} != "
        f"len(text_config.engram_layer_ids) = {len(t.engram_layer_ids)}",
    )
    check(
        t.engram_max_ngram_size >= 2,
        f"text_config.engram_max_ngram_size must be >= 2, got {t.engram_max_ngram_size}",
    )
    check(t.engram_vocab_size >= 2, f"text_config.engram_vocab_size must be >= 2, got {t.engram_vocab_size}")
    check(
        0 <= t.engram_pad_token_id < t.vocab_size,
        f"text_config.engram_pad_token_id = {t.engram_pad_token_id} is outside [0, {t.vocab_size})",
    )
    check(
        t.engram_compressed_vocab_size <= t.vocab_size,
        f"text_config.engram_compressed_vocab_size ({t.engram_compressed_vocab_size}) exceeds "
        f"text_config.vocab_size ({t.vocab_size})",
    )
    for i, rows in enumerate(t.engram_num_embeddings):
        check(rows > 0, f"text_config.engram_num_embeddings[{i}] must be > 0, got {rows}")
    if problems:
        raise ConfigError(f"{where}: invalid config: " + "; ".join(problems))
