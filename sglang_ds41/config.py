"""The DeepSeek-V4.1 `config.json` as typed, validated, frozen objects (docs/MODEL.md §1).

The released file is nested: root identity and `quantization_config` at the root, the language
model under `text_config`, the ViT under `vision_config`. Fields the release omits get the
V4.1 values of docs/MODEL.md §1.1 (never SGL's V4-era dataclass defaults). Every problem is a
`Ds41Error` naming the field, so a bad config fails at load time instead of deep in a forward.

Every field below carries a one-line comment: what it is, the official release's value, and the
section of docs/MODEL.md it comes from (`§4.2` = docs/MODEL.md §4.2).
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

    rope_type: str  # "yarn" (§4.2)
    factor: float  # 16: the slow end of the blend uses f / factor (§4.2)
    beta_fast: float  # 32: rotations per context that set the ramp's start `lo` (§4.2)
    beta_slow: float  # 1: rotations per context that set the ramp's end `hi` (§4.2)
    original_max_position_embeddings: int  # 65536: the pre-extension context in lo / hi (§4.2)


@dataclass(frozen=True)
class QuantizationConfig:
    """Root `quantization_config`: FP8 32x32 blocks + MXFP4 experts, or the NVIDIA NVFP4 mix (§1.2)."""

    quant_method: str  # "fp8" in both releases (§1.1, §1.2)
    activation_scheme: str = "dynamic"  # FP8 activation scales computed at run time (§8.1)
    weight_block_size: tuple[int, ...] = (32, 32)  # FP8 weight blocks, one scale per 32x32 (§8.1)
    scale_fmt: str = "ue8m0"  # block scales are powers of two, E8M0 bytes (§8.1)
    expert_dtype: str = "fp4"  # routed experts stored as MXFP4 (§8.2)
    # NVIDIA ModelOpt release only (§1.2); absent in the base release.
    quant_algo: str | None = None  # "MIXED_PRECISION" (§1.2)
    moe_quant_algo: str | None = None  # "NVFP4": the routed experts' format (§1.2, §8.3)
    group_size: int | None = None  # 16 values per NVFP4 E4M3 scale (§8.3)
    kv_cache_quant_algo: str | None = None  # null: ModelOpt leaves the KV cache alone (§1.2)
    ignore: tuple[str, ...] = ()  # module patterns ModelOpt did not quantise (§1.2)
    quantized_layers: Mapping[str, Any] | None = None  # experts listed here are NVFP4 (§1.2)
    config_groups: Mapping[str, Any] | None = None  # ModelOpt's W4A4 group description (§1.2)
    producer: Mapping[str, Any] | None = None  # {"name": "modelopt", "version": ...} (§1.2)
    # Ours: 4-bit Engram tables (§8.4); absent or "fp8" = the official FP8 tables.
    engram_embed_quant: str | None = None  # "mxfp4" / "nvfp4" / "fp8" Engram table format (§8.4)
    engram_embed_block_size: int | None = None  # values per table scale: 32 MXFP4, 16 NVFP4 (§8.4)
    engram_embed_layers: tuple[int, ...] | None = None  # Engram layer ids converted; None = all (§8.4)


@dataclass(frozen=True)
class TextConfig:
    """`text_config`: the 40-layer MoE decoder, its attention schedule, Engram and DSpark."""

    model_type: str  # "deepseek_v41_text" (§1.1)
    vocab_size: int  # 129280 token ids: rows of `embed` and `head` (§1.1, §8.6.1)
    hidden_size: int  # D = 5120, the model width (§1.1)
    num_hidden_layers: int  # 40 backbone layers; the DSpark stages come on top (§1.1, §1.3)
    num_attention_heads: int  # 64 query heads (§4.2)
    num_key_value_heads: int  # 1: the single latent that is both key and value (§4.2)
    head_dim: int  # 512 channels per query head and per K=V latent (§4.2)
    qk_rope_head_dim: int  # 64: the trailing channels of a head that RoPE rotates (§4.2)
    q_lora_rank: int  # 1280: width of q_lora between wq_a and wq_b (§4.2)
    o_lora_rank: int  # 1024: each output group's width after wo_a (§4.3)
    o_groups: int  # 8 groups of heads in the output projection (§4.3)
    hidden_act: str  # "silu": the SwiGLU gate activation of the experts (§6.3)
    swiglu_limit: float  # 10.0: clamp of both SwiGLU branches (§6.3)
    rms_norm_eps: float  # 1e-20: eps of every LM RMSNorm, the mHC and Engram statistics (§3.2, §5.6)
    max_position_embeddings: int  # 1048576 = 65536 x 16 positions (§1.1)
    rope_theta: float  # 10000: RoPE base of window-only layers, no YaRN (§4.2)
    rope_scaling: RopeScaling | None  # the YaRN blend of compressed layers (§4.2)
    compress_rope_theta: float  # 160000: RoPE base of compressed (ratio 1/2) layers (§4.2)
    n_routed_experts: int  # 384 routed experts per layer (§6.1)
    n_shared_experts: int  # 1 always-on shared expert (§6.1)
    num_experts_per_tok: int  # 6 routed experts per token (§6.2)
    moe_intermediate_size: int  # 2304: hidden width of routed and shared experts (§6.1)
    scoring_func: str  # "sqrtsoftplus": router scores sqrt(softplus(logits)) (§6.2)
    topk_method: str  # "noaux_tc": experts selected on scores + bias (§6.2)
    norm_topk_prob: bool  # true: the selected scores are normalised to sum 1 (§6.2)
    routed_scaling_factor: float  # 1.5: factor on the normalised routing weights (§6.2)
    sliding_window: int  # 128 window positions, the query's own included (§4.3)
    compress_ratios: tuple[int, ...]  # per layer then DSpark stage: 0 window, 1 or 2 tokens/entry (§1.3)
    kv_source_layer_ids: tuple[int, ...]  # [2, 8, 14, 20]: Full layers with a compressor (§1.3, §4.4)
    index_source_layer_ids: tuple[int, ...]  # layers that run their own indexer queries (§1.3, §4.5)
    index_n_heads: int  # 32 indexer heads (§4.5)
    index_head_dim: int  # 128: width of an indexer head and index key (§4.5)
    index_topk: int  # 512 compressed entries attended per query (§4.5)
    candidate_source_layer_id: int  # 20: publishes the candidate block mask (§4.5)
    candidate_topk_blocks: int  # 2048 candidate blocks kept per query (§4.5)
    candidate_block_size: int  # 8 compressed entries per candidate block (§4.5)
    hc_mult: int  # hc = 4 copies of the residual stream (§3)
    hc_sinkhorn_iters: int  # 20 Sinkhorn normalisation rounds for comb (§3.2)
    hc_eps: float  # 1e-6: added to pre and inside Sinkhorn (§3.2)
    engram_layer_ids: tuple[int, ...]  # [1, 14]: layers with an Engram memory (§5)
    engram_num_embeddings: tuple[int, ...]  # table rows per Engram layer, sums of its primes (§5.3)
    engram_max_ngram_size: int  # 4: hashed n-grams of 2, 3 and 4 tokens (§5.3, §5.5)
    engram_vocab_size: int  # 16000000: the prime search starts above it (§5.3)
    engram_n_heads: int  # 8 hash heads per n-gram size (§5.3)
    engram_head_dim: int  # 256 values per table row (§5.1)
    engram_pad_token_id: int  # 2: its compressed id stands for blocked look-backs (§5.2, §5.5)
    engram_compressed_vocab_size: int  # 99092: the token map's size; sets the multipliers (§5.2, §5.4)
    num_nextn_predict_layers: int  # 3 DSpark draft stages (§10)
    # Present in the release; defaults = released values, for hand-written (test) configs.
    attention_bias: bool = False  # false: no biases in the attention linears (§1.1)
    attention_dropout: float = 0.0  # 0.0, training only (§1.1)
    initializer_range: float = 0.02  # 0.02, training only (§1.1)
    use_cache: bool = True  # true, HF generation flag (§1.1)
    tie_word_embeddings: bool = False  # false: `head` is its own tensor (§2)
    dspark_block_size: int = 5  # 5 positions per draft block (§10)
    dspark_noise_token_id: int = 128799  # fills the draft block after the anchor token (§10)
    dspark_target_layer_ids: tuple[int, ...] = ()  # [37, 38, 39]: layers that feed DSpark (§3.3, §10)
    dspark_markov_rank: int = 256  # rank of the DSpark Markov head (§10)
    dspark_n_routed_experts: int = 128  # routed experts per DSpark stage (§6.1, §10)
    dspark_num_experts_per_tok: int = 3  # routed experts per token in DSpark (§10)
    # Absent from the release: V4.1 values (§1.1), not SGL's V4 defaults.
    num_hash_layers: int = 0  # 0 hash-routed MoE layers (V4 had 3) (§1.1, §6.4)
    n_group: int = 1  # 1: no group-limited routing (§1.1, §6.2)
    topk_group: int = 1  # 1: no group-limited routing (§1.1, §6.2)
    first_k_dense_replace: int = 0  # 0: every layer is MoE (§1.1, §6.1)
    gate_temp: float = 1.0  # router logits are divided by it (§6.2)
    q_head_norm: bool = False  # False: no per-head query norm in V4.1 (§4.2)
    hc_pre_from_prev_sublayer: bool = True  # True: a sublayer collapses with the previous site's pre (§3.3)


@dataclass(frozen=True)
class VisionConfig:
    """`vision_config`: the ViT and its image preprocessing (§7)."""

    model_type: str  # "deepseek_v41_vision" (§1.1)
    num_hidden_layers: int  # 32 ViT blocks (§7.2)
    hidden_size: int  # 1024: ViT width (§7.2)
    num_attention_heads: int  # 16 ViT heads of 64 (§7.2)
    intermediate_size: int  # 2816: ViT MLP width (§7.2)
    patch_size: int  # 14 px patches (§7.1)
    rope_theta: float  # 10000: base of the ViT's 2-D RoPE (§7.2)
    downsample_ratio: int  # 3: the aligner merges 3x3 patches into one LM position (§7.1, §7.2)
    max_image_tokens: int  # 1024: most prompt positions one image may take (§7.1)
    min_pixels: int  # 295936 = 544^2: smaller images are scaled up to this area (§7.1)
    max_wh_ratio: float | None = None  # null: no clamp of the aspect ratio (§7.1)


@dataclass(frozen=True)
class V41Config:
    """The whole `config.json`."""

    text: TextConfig  # `text_config`: the language model (§1.1)
    vision: VisionConfig | None  # `vision_config`: the vision tower; None if absent (§1.1, §7)
    quantization: QuantizationConfig | None  # root `quantization_config`; None = unquantised (§1.1, §1.2)
    architectures: tuple[str, ...]  # ["DeepseekV41ForCausalLM"] (§1.1)
    model_type: str  # "deepseek_v41" (§1.1)
    bos_token_id: int  # 0 (§1.1)
    eos_token_id: int  # 1 (§1.1)
    pad_token_id: int  # 2 (§1.1)
    image_token_id: int  # 129264: the placeholder id every image position carries (§7.3)
    dtype: str = "bfloat16"  # "bfloat16": activation dtype (§1.1)
    transformers_version: str | None = None  # "5.6.0", informational (§1.1)
    source: str = field(default="<dict>", compare=False)  # ours: where the config was read, for messages

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
