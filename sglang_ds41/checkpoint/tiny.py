"""Tiny checkpoints: the real release's directory layout, names, dtypes and formats, ~45 MB.

The shape is MODEL.md §11 (every structural feature: window-only layers, Engram on a window-only
and on a ratio-2 layer, ratio-2 Full/Reuse, ratio-1 Full + candidate source, Reindex consumer,
4 hc copies, YaRN active) with three changes so a *served* tiny model sees real text:

* the real vocabulary (129,280 ids, image id 129,264) and the real tokenizer files, so prompts,
  tool calls and Engram hashing (compressed vocabulary 99,092) are the production ones;
* a longer context (8,192 positions, YaRN original 512 x 16) than §11's 512, because rendered
  chat prompts with tool schemas alone exceed 512 tokens (YaRN stays active: lo = 0, hi = 3);
* three DSpark stages and a one-block ViT, like the release (the tensors must load and
  validate even where they are not run).

Weights are random with per-tensor seeds (sha256 of seed and name), so a tensor's bytes do not
depend on which other tensors exist. Linears have std 1/sqrt(fan_in) so every projection keeps
unit scale, norms are 1, and the head has std 2/sqrt(D) so logits vary (std ~2) with the
context and greedy decoding does not collapse to one token. The NVFP4 variant re-encodes the
MXFP4 experts of the base variant losslessly (as NVIDIA converted the release), and MXFP4 /
NVFP4 Engram tables are the FP8 tables re-encoded exactly as `convert-engram` does by default
(the ``mse`` scale rule; NVFP4's global scale from the FP8 scales), so all variants of a seed are
the same model up to quantisation and a converted FP8 tiny checkpoint equals the 4-bit one.
"""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import json
import os
import shutil
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from sglang_ds41.checkpoint.manifest import (
    BASE,
    ENGRAM_FORMATS,
    NVFP4,
    VARIANTS,
    Manifest,
    build_manifest,
    release_variant,
    table_format,
)
from sglang_ds41.checkpoint.reader import CONFIG_FILE, HF_QUANT_FILE, INDEX_FILE
from sglang_ds41.config import TextConfig, V41Config
from sglang_ds41.errors import Ds41Error

_TINY: dict[str, Any] = {
    "architectures": ["DeepseekV41ForCausalLM"],
    "model_type": "deepseek_v41",
    "dtype": "bfloat16",
    "transformers_version": "5.6.0",
    "bos_token_id": 0, "eos_token_id": 1, "pad_token_id": 2, "image_token_id": 129264,
    "quantization_config": {
        "quant_method": "fp8", "activation_scheme": "dynamic", "weight_block_size": [32, 32],
        "scale_fmt": "ue8m0", "expert_dtype": "fp4",
    },
    "text_config": {
        "model_type": "deepseek_v41_text",
        "vocab_size": 129280, "hidden_size": 64, "num_hidden_layers": 8,
        "num_attention_heads": 4, "num_key_value_heads": 1, "head_dim": 64,
        "qk_rope_head_dim": 16, "q_lora_rank": 32, "o_lora_rank": 32, "o_groups": 2,
        "hidden_act": "silu", "swiglu_limit": 10.0, "rms_norm_eps": 1e-20,
        "attention_bias": False, "attention_dropout": 0.0, "initializer_range": 0.02,
        "use_cache": True, "tie_word_embeddings": False,
        "max_position_embeddings": 8192, "rope_theta": 10000,
        "rope_scaling": {"rope_type": "yarn", "factor": 16, "beta_fast": 32, "beta_slow": 1,
                         "original_max_position_embeddings": 512},
        "compress_rope_theta": 160000,
        "n_routed_experts": 8, "n_shared_experts": 1, "num_experts_per_tok": 2,
        "moe_intermediate_size": 32, "scoring_func": "sqrtsoftplus", "topk_method": "noaux_tc",
        "norm_topk_prob": True, "routed_scaling_factor": 1.5,
        "sliding_window": 8,
        "compress_ratios": [0, 0, 2, 2, 1, 1, 1, 1, 0, 0, 0],
        "kv_source_layer_ids": [2, 4],
        "index_source_layer_ids": [2, 4, 6],
        "index_n_heads": 2, "index_head_dim": 32, "index_topk": 4,
        "candidate_source_layer_id": 4, "candidate_topk_blocks": 2, "candidate_block_size": 4,
        "hc_mult": 4, "hc_sinkhorn_iters": 20, "hc_eps": 1e-6,
        "engram_layer_ids": [1, 2], "engram_num_embeddings": [434, 606],
        "engram_max_ngram_size": 4, "engram_vocab_size": 61, "engram_n_heads": 2,
        "engram_head_dim": 32, "engram_pad_token_id": 2, "engram_compressed_vocab_size": 99092,
        "num_nextn_predict_layers": 3, "dspark_block_size": 5, "dspark_noise_token_id": 128799,
        "dspark_target_layer_ids": [5, 6, 7], "dspark_markov_rank": 16,
        "dspark_n_routed_experts": 4, "dspark_num_experts_per_tok": 2,
    },
    "vision_config": {
        "model_type": "deepseek_v41_vision", "num_hidden_layers": 1, "hidden_size": 32,
        "num_attention_heads": 2, "intermediate_size": 32, "patch_size": 2, "rope_theta": 10000,
        "downsample_ratio": 3, "max_image_tokens": 64, "min_pixels": 16, "max_wh_ratio": None,
    },
}  # fmt: skip

# NVIDIA's ModelOpt fields (MODEL.md §1.2), added for `--variant nvfp4`.
_NV_IGNORE = ["*.attn.*", "*.ffn.shared_experts.*", "head", "mtp.*"]
_NV_PRODUCER = {"name": "modelopt", "version": "0.47.0rc0"}

# Activation amax the NVFP4 `input_scale` is calibrated for: the experts see RMS-normalised
# inputs, whose entries stay well inside +-16.
_NV_INPUT_AMAX = 16.0


# The fields of `engram_num_embeddings`' prime layout (`engram.layout.build_layout`).
_ENGRAM_LAYOUT_FIELDS = (
    "engram_layer_ids", "engram_vocab_size", "engram_max_ngram_size", "engram_n_heads",
    "engram_compressed_vocab_size",
)  # fmt: skip


def tiny_config(
    variant: str = BASE, engram: str = "fp8", overrides: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """The nested `config.json` of a tiny checkpoint (a fresh dict).

    `overrides`: `text_config` fields to replace (a bigger tiny model: `hidden_size`,
    `index_topk`, ...). `engram_num_embeddings` follows the prime layout of the result unless
    given; the config is validated (`V41Config`), so an inconsistent set is refused by name."""
    if variant not in VARIANTS:
        raise Ds41Error(f"unknown variant {variant!r}, expected one of {list(VARIANTS)}")
    if engram not in ENGRAM_FORMATS:
        raise Ds41Error(f"unknown Engram format {engram!r}, expected one of {list(ENGRAM_FORMATS)}")
    data = copy.deepcopy(_TINY)
    if overrides:
        _override_text(data["text_config"], overrides)
    quant = data["quantization_config"]
    if engram != "fp8":
        quant.update(
            engram_embed_quant=engram,
            engram_embed_block_size=16 if engram == "nvfp4" else 32,
            engram_embed_layers=list(data["text_config"]["engram_layer_ids"]),
        )
    if variant == NVFP4:
        quant.update(_nv_quant_fields(data["text_config"]["num_hidden_layers"]))
    if overrides:
        V41Config.from_dict(data, source="tiny_config(overrides)")  # names the field that breaks it
    return data


def _override_text(text: dict[str, Any], overrides: Mapping[str, Any]) -> None:
    """`text` (the tiny text_config) with `overrides` merged in, the Engram rows recomputed."""
    from sglang_ds41.engram.layout import build_layout

    known = {f.name for f in dataclasses.fields(TextConfig)}
    unknown = sorted(set(overrides) - known)
    if unknown:
        raise Ds41Error(f"tiny_config: unknown text_config field(s) {unknown} in overrides")
    text.update(copy.deepcopy(dict(overrides)))
    if "engram_num_embeddings" not in overrides:
        layout = build_layout(*(text[name] for name in _ENGRAM_LAYOUT_FIELDS))
        text["engram_num_embeddings"] = [layer.num_rows for layer in layout.layers]


def _nv_quantized_layers(n_layers: int) -> dict[str, Any]:
    return {f"layers.{i}.ffn.experts": {"quant_algo": "NVFP4", "group_size": 16} for i in range(n_layers)}


def _nv_quant_fields(n_layers: int) -> dict[str, Any]:
    fp4 = {"num_bits": 4, "type": "float", "group_size": 16, "dynamic": False}
    return {
        "quant_algo": "MIXED_PRECISION",
        "moe_quant_algo": "NVFP4",
        "group_size": 16,
        "kv_cache_quant_algo": None,
        "ignore": list(_NV_IGNORE),
        "producer": dict(_NV_PRODUCER),
        "quantized_layers": _nv_quantized_layers(n_layers),
        "config_groups": {"group_0": {"targets": ["Linear"], "weights": fp4, "input_activations": fp4}},
    }


def hf_quant_config(n_layers: int) -> dict[str, Any]:
    """ModelOpt's `hf_quant_config.json` for the NVFP4 variant (§1.2)."""
    return {
        "producer": dict(_NV_PRODUCER),
        "quantization": {
            "quant_algo": "MIXED_PRECISION",
            "kv_cache_quant_algo": None,
            "exclude_modules": list(_NV_IGNORE),
            "quantized_layers": _nv_quantized_layers(n_layers),
        },
    }


# --- weights -----------------------------------------------------------------------------------


def _generator(seed: int, name: str):
    import torch

    digest = hashlib.sha256(f"{seed}:{name}".encode()).digest()
    return torch.Generator().manual_seed(int.from_bytes(digest[:8], "little") >> 1)


def _normal(shape, std: float, seed: int, name: str):
    import torch

    return torch.randn(tuple(shape), generator=_generator(seed, name), dtype=torch.float32) * std


def _plain_value(name: str, shape: tuple[int, ...], seed: int):
    """Initial values of a BF16/F32 tensor, chosen by what the tensor does."""
    import torch

    leaf = name.rsplit(".", 2)
    if name.endswith(("norm.weight", "norm1.weight", "norm2.weight")):
        return torch.ones(shape)
    if name.endswith(".bias") and not name.endswith(("gate.bias",)):
        return _normal(shape, 0.02, seed, name)  # vision / aligner linear biases
    if name.endswith("hc_attn_scale") or name.endswith("hc_ffn_scale"):
        return 0.5 + 0.5 * torch.rand(shape, generator=_generator(seed, name))
    if name.endswith("_base"):  # hc bases: moderate logits for pre/post/comb
        return _normal(shape, 0.5, seed, name)
    if name.endswith(("gate.bias", "gate.bias_vl")):
        return _normal(shape, 0.1, seed, name)
    if name in ("embed.weight",) or name.endswith(("markov_head.embed.weight", "attn_sink")):
        return _normal(shape, 1.0, seed, name)
    if name.startswith("image_") or leaf[-1] in ("q_weight", "k_weight"):
        return _normal(shape, 1.0, seed, name)
    if name == "head.weight":
        return _normal(shape, 2.0 / shape[1] ** 0.5, seed, name)
    if len(shape) == 2:  # a linear [out, in]
        return _normal(shape, shape[1] ** -0.5, seed, name)
    return _normal(shape, 1.0, seed, name)


def _dense_linear(prefix: str, out: int, inp: int, seed: int):
    return _normal((out, inp), inp**-0.5, seed, prefix)


Dense = Mapping[str, Any]


def _weights(manifest: Manifest, seed: int, dense: Dense | None = None) -> dict[str, Any]:
    """All tensors of a base-variant, FP8-Engram `manifest` (torch, in the manifest's dtypes).
    `dense` gives the values of some weights by checkpoint name (the prefix of a quantised one,
    e.g. `layers.0.attn.wq_a`, and `layers.1.engram.embed` for a table's float rows); the rest
    are random by `seed`."""
    import torch

    from sglang_ds41 import formats
    from sglang_ds41.formats.engram import FP8, table_prefix, tensor_name

    dense = dense or {}
    out: dict[str, Any] = {}
    for spec in manifest:
        name, shape = spec.name, spec.shape
        prefix = name.removesuffix(".weight")
        if spec.format in ("bf16", "f32"):
            dtype = torch.bfloat16 if spec.dtype == "BF16" else torch.float32
            value = dense[name] if name in dense else _plain_value(name, shape, seed)
            out[name] = value.to(dtype).contiguous()
        elif spec.role != "weight":
            continue  # scales are written together with their weight
        elif spec.format == "fp8":
            value = dense[prefix] if prefix in dense else _dense_linear(prefix, *shape, seed)
            w, s = formats.quantize_fp8_block2d(value)
            out[name], out[f"{prefix}.scale"] = w, s
        elif spec.format == "mxfp4":
            rows, inp = shape[0], shape[1] * 2
            value = dense[prefix] if prefix in dense else _dense_linear(prefix, rows, inp, seed)
            codes, scales = formats.quantize_mxfp4(value)
            out[name], out[f"{prefix}.scale"] = codes.view(torch.int8), scales
        elif table_format(spec) is FP8:  # the official FP8 rows
            value = dense[prefix] if prefix in dense else _normal(shape, 1.0, seed, prefix)
            values, scales = formats.quantize_fp8_rows(value)
            table = table_prefix(name)
            out[tensor_name(table, FP8.values)], out[tensor_name(table, FP8.scales)] = values, scales
        else:  # pragma: no cover - a new format without a generator is a programming error
            raise AssertionError(f"no generator for {spec.format} in the base variant")
    return out


def as_variant(base: Mapping[str, Any], manifest: Manifest) -> dict[str, Any]:
    """The tensors of `manifest` (any variant and Engram format) from those of the same model's
    base variant with FP8 tables: NVFP4 experts are the MXFP4 ones re-encoded losslessly (as
    NVIDIA converted the release), 4-bit Engram tables the FP8 rows re-encoded as
    `convert-engram` does by default; everything else is the same tensor."""
    import torch

    from sglang_ds41 import formats
    from sglang_ds41.checkpoint.convert.recode import default_scale_rule
    from sglang_ds41.formats.engram import FP8, table_prefix, tensor_name

    out: dict[str, Any] = {}
    for spec in manifest:
        name = spec.name
        prefix = name.removesuffix(".weight")
        table = table_format(spec)
        if spec.format == "nvfp4" and spec.role == "weight":
            # Lossless, as NVIDIA's conversion of the release was: same codes and values.
            w, ws, ws2 = formats.mxfp4_to_nvfp4(base[name].view(torch.uint8), base[f"{prefix}.scale"])
            out[name], out[f"{prefix}.weight_scale"] = w, ws
            out[f"{prefix}.weight_scale_2"] = ws2.reshape(())
            out[f"{prefix}.input_scale"] = formats.nvfp4.global_scale(_NV_INPUT_AMAX).reshape(())
        elif table is not None:
            if name in out:
                continue  # written with the table's values
            at = table_prefix(name)
            fp8 = base[tensor_name(at, FP8.values)], base[tensor_name(at, FP8.scales)]
            encoded = table.from_fp8_rows(*fp8, default_scale_rule(table.name))
            out.update({tensor_name(at, part): t for part, t in zip(table.parts, encoded, strict=True)})
        elif spec.role == "weight" or spec.format in ("bf16", "f32"):
            out[name] = base[name]
            if spec.format in ("fp8", "mxfp4"):
                out[f"{prefix}.scale"] = base[f"{prefix}.scale"]
    missing = [spec.name for spec in manifest if spec.name not in out]
    if missing:  # pragma: no cover - a new format without a conversion is a programming error
        raise AssertionError(f"as_variant: no conversion for {missing[:3]}")
    return out


# --- files -------------------------------------------------------------------------------------


def _shard_of(name: str, n_layers: int) -> int:
    """Shard number (0-based): globals + vision, then two backbone layers per shard, then DSpark."""
    parts = name.split(".")
    if parts[0] == "layers":
        return 1 + int(parts[1]) // 2
    if parts[0] == "mtp":
        return 1 + -(-n_layers // 2)
    return 0


def base_tensors(
    seed: int = 0, overrides: Mapping[str, Any] | None = None, dense: Dense | None = None
) -> dict[str, Any]:
    """Every tensor of the base variant with FP8 Engram tables (`_weights`)."""
    config = V41Config.from_dict(tiny_config(BASE, "fp8", overrides), source="tiny_config()")
    return _weights(build_manifest(config), seed, dense)


def write_tiny(
    out_dir: str | Path,
    variant: str = BASE,
    engram: str = "fp8",
    seed: int = 0,
    overrides: Mapping[str, Any] | None = None,
    dense: Dense | None = None,
) -> Path:
    """Write a tiny checkpoint directory; same arguments -> byte-identical files.
    `overrides`: `text_config` fields to replace (`tiny_config`); `dense`: trained values of
    weights by checkpoint name (`_weights`; the trained model, `sglang_ds41.training.export`)."""
    data = tiny_config(variant, engram, overrides)
    return write_checkpoint(out_dir, data, lambda: base_tensors(seed, overrides, dense))


def write_checkpoint(
    out_dir: str | Path, data: dict[str, Any], base: Callable[[], Mapping[str, Any]]
) -> Path:
    """Write the checkpoint of config `data` (a tiny layout: `tiny_config` with any overrides,
    variant and Engram format) from the tensors of its base variant with FP8 tables (`base()`,
    called once the output directory is known to be writable): the shards, the index, the
    config, ModelOpt's `hf_quant_config.json` for the NVFP4 variant and the tokenizer files."""
    from safetensors.torch import save_file

    from sglang_ds41.assets import TOKENIZER_DIR

    out = Path(out_dir)
    if out.exists() and not out.is_dir():
        raise Ds41Error(f"{out} exists and is not a directory")
    if out.is_dir() and any(out.iterdir()):
        raise Ds41Error(f"output directory {out} is not empty")
    try:  # before any work: an output that cannot be written is the user's to fix
        out.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise Ds41Error(f"cannot write {out}: {error.strerror}") from None
    config = V41Config.from_dict(data, source="the checkpoint's config")
    manifest = build_manifest(config)
    tensors = as_variant(base(), manifest)
    n_layers = config.text.num_hidden_layers
    n_shards = 2 + -(-n_layers // 2)
    groups: list[dict[str, Any]] = [{} for _ in range(n_shards)]
    for spec in manifest:
        groups[_shard_of(spec.name, n_layers)][spec.name] = tensors[spec.name]
    weight_map: dict[str, str] = {}
    for i, group in enumerate(groups):
        file = f"model-{i + 1:05d}-of-{n_shards:05d}.safetensors"
        save_file(group, str(out / file), metadata={"format": "pt"})
        os.chmod(out / file, 0o644)  # safetensors creates 0600; a server may run as another user
        weight_map.update({name: file for name in group})
    index = {"metadata": {"total_size": manifest.total_bytes}, "weight_map": dict(sorted(weight_map.items()))}
    (out / INDEX_FILE).write_text(json.dumps(index, indent=2) + "\n")
    (out / CONFIG_FILE).write_text(json.dumps(data, indent=2) + "\n")
    if release_variant(config.quantization) == NVFP4:
        (out / HF_QUANT_FILE).write_text(json.dumps(hf_quant_config(n_layers), indent=2) + "\n")
    for file in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copyfile(TOKENIZER_DIR / file, out / file)
    return out
