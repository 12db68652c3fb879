"""Every tensor a V4.1 checkpoint must hold, derived from its config (MODEL.md §8.6, §8.3, §8.4).

The manifest is the single statement of the checkpoint layout: `inspect` validates shard headers
against it, `make-tiny` writes exactly its tensors, and the loaders ask it how a name is stored.
Applied to the official config it reproduces the released index: 96,085 tensors and
510,286,023,000 bytes (base), 188,245 tensors and 527,273,322,840 bytes (NVIDIA NVFP4).

Formats (`TensorSpec.format`) and the tensors of one quantised weight (`role`):
* ``bf16`` / ``f32``: a plain tensor (role ``param``).
* ``fp8``: a dense linear, ``.weight`` F8_E4M3 ``[out, in]`` + ``.scale`` F8_E8M0 32x32 blocks.
* ``mxfp4``: ``.weight`` I8 ``[out, in/2]`` (two E2M1 codes per byte) + ``.scale`` E8M0 per 32.
* ``nvfp4``: ``.weight`` U8 ``[out, in/2]`` + ``.weight_scale`` F8_E4M3 per 16 + 0-d F32
  ``.weight_scale_2`` and ``.input_scale`` (ModelOpt names).
* ``engram_fp8`` / ``engram_mxfp4`` / ``engram_nvfp4``: the Engram tables, whose tensors,
  dtypes and the spellings a checkpoint may use instead are `formats.engram`'s (the one place).
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from functools import cached_property

from sglang_ds41.config import ConfigError, QuantizationConfig, TextConfig, V41Config
from sglang_ds41.formats import engram as engram_formats
from sglang_ds41.formats import sizes

BASE = "base"
NVFP4 = "nvfp4"
VARIANTS = (BASE, NVFP4)
ENGRAM_FORMATS = engram_formats.NAMES
ENGRAM_PREFIX = "engram_"  # TensorSpec.format of a table tensor: engram_ + its format's name
_PACKED_FORMATS = ("mxfp4", "nvfp4", *(ENGRAM_PREFIX + name for name in engram_formats.FOUR_BIT))
_PACKED_DTYPES = ("U8", "I8")  # packed E2M1 pairs: the same bytes either way (§8.2, §8.4)

FP8_BLOCK = 32  # FP8 linears: one E8M0 scale per 32 x 32 block
MX_BLOCK = sizes.scale_block("mxfp4")  # 32 values per E8M0 scale
NV_BLOCK = sizes.scale_block("nvfp4")  # 16 values per E4M3 scale

# Bytes per element of each safetensors dtype the release uses.
DTYPE_BYTES = {"BF16": 2, "F32": 4, "F8_E4M3": 1, "F8_E8M0": 1, "I8": 1, "U8": 1}

# Parameter groups of MODEL.md §9.1.
BACKBONE = "backbone"
ROUTED_EXPERTS = "routed_experts"
ENGRAM_TABLES = "engram_tables"
DSPARK = "dspark"
VISION = "vision"

_QUANT_LAYER_KEY = re.compile(r"^(layers|mtp)\.(\d+)\.ffn\.experts$")


@dataclass(frozen=True)
class TensorSpec:
    """One expected tensor: its safetensors name, dtype and shape, and how to read it."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    format: str  # bf16 | f32 | fp8 | mxfp4 | nvfp4 | engram_fp8 | engram_mxfp4 | engram_nvfp4
    role: str  # param | weight | scale | weight_scale | weight_scale_2 | input_scale
    group: str  # BACKBONE | ROUTED_EXPERTS | ENGRAM_TABLES | DSPARK | VISION
    also: tuple[str, ...] = ()  # other dtypes stored with the same bytes (`accepts`)

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * DTYPE_BYTES[self.dtype]

    @property
    def parameters(self) -> int:
        """Model parameters stored here: packed 4-bit codes count 1 each, scales count 0 (§9.1)."""
        if self.role == "param":
            return math.prod(self.shape)
        if self.role != "weight":
            return 0
        return math.prod(self.shape) * (2 if self.format in _PACKED_FORMATS else 1)

    def accepts(self, dtype: str, shape: tuple[int, ...]) -> bool:
        """Whether a stored tensor matches. Tolerated spellings of the same bytes (`also`): packed
        E2M1 as U8 or I8 (§8.2, §8.4), an Engram table's E8M0 scales as U8; NVFP4 global scales
        as 0-d or [1] (§12 item 2)."""
        dtype_ok = dtype == self.dtype or dtype in self.also
        scalar = self.role in ("weight_scale_2", "input_scale")
        shape_ok = tuple(shape) == self.shape or (scalar and tuple(shape) == (1,))
        return dtype_ok and shape_ok

    def describe(self) -> str:
        return f"{self.dtype} {list(self.shape)} ({self.format} {self.role})"


@dataclass(frozen=True)
class Manifest:
    """The expected tensors of one checkpoint, in a stable order (globals, layers, DSpark, vision)."""

    tensors: tuple[TensorSpec, ...] = field(repr=False)
    variant: str
    engram_format: str
    engram_formats: Mapping[int, str]  # Engram layer id -> fp8 | mxfp4

    @cached_property
    def by_name(self) -> dict[str, TensorSpec]:
        return {t.name: t for t in self.tensors}

    def __contains__(self, name: str) -> bool:
        return name in self.by_name

    def __getitem__(self, name: str) -> TensorSpec:
        return self.by_name[name]

    def __iter__(self) -> Iterator[TensorSpec]:
        return iter(self.tensors)

    def __len__(self) -> int:
        return len(self.tensors)

    @property
    def total_bytes(self) -> int:
        return sum(t.nbytes for t in self.tensors)

    @property
    def parameters(self) -> int:
        return sum(t.parameters for t in self.tensors)

    def bytes_by_format(self) -> dict[str, int]:
        out: Counter[str] = Counter()
        for t in self.tensors:
            out[t.format] += t.nbytes
        return dict(sorted(out.items()))

    def parameters_by_group(self) -> dict[str, int]:
        out: Counter[str] = Counter()
        for t in self.tensors:
            out[t.group] += t.parameters
        return dict(out)

    def format_of(self, prefix: str) -> str | None:
        """Storage format of the weight `prefix` (e.g. ``layers.0.attn.wq_a``), None if unknown."""
        for suffix in (".weight", ""):
            spec = self.by_name.get(prefix + suffix)
            if spec is not None:
                return spec.format
        return None


def table_format(spec: TensorSpec) -> engram_formats.EngramFormat | None:
    """The Engram table format of a table tensor's spec; None for every other tensor."""
    if spec.group != ENGRAM_TABLES:
        return None
    return engram_formats.engram_format(spec.format.removeprefix(ENGRAM_PREFIX))


# --- release variant and Engram table format (from quantization_config) ------------------------


def release_variant(quant: QuantizationConfig | None) -> str:
    """``nvfp4`` for NVIDIA's ModelOpt mix (routed experts NVFP4), else ``base``."""
    if quant is None:
        return BASE
    if (quant.moe_quant_algo or "").upper() == "NVFP4" or quant.quantized_layers:
        return NVFP4
    if quant.quant_algo is not None and quant.quant_algo.upper() not in ("FP8", "MIXED_PRECISION"):
        raise ConfigError(
            f"quantization_config.quant_algo = {quant.quant_algo!r}: expected absent (base release) "
            "or 'MIXED_PRECISION' (NVIDIA NVFP4 release)"
        )
    return BASE


def nvfp4_expert_prefixes(config: V41Config) -> set[str]:
    """The `*.ffn.experts` modules stored as NVFP4: membership in `quantized_layers` decides (§1.2);
    without that map, the routed experts of every backbone layer (never the DSpark ones)."""
    t, quant = config.text, config.quantization
    if release_variant(quant) != NVFP4:
        return set()
    assert quant is not None
    if not quant.quantized_layers:
        return {f"layers.{layer}.ffn.experts" for layer in range(t.num_hidden_layers)}
    prefixes = set()
    for key, spec in quant.quantized_layers.items():
        match = _QUANT_LAYER_KEY.match(key)
        limit = t.num_hidden_layers if match and match[1] == "layers" else t.num_nextn_predict_layers
        if match is None or int(match[2]) >= limit:
            raise ConfigError(
                f"quantization_config.quantized_layers key {key!r}: expected 'layers.L.ffn.experts' "
                f"with L < {t.num_hidden_layers} (or 'mtp.S.ffn.experts' with S < "
                f"{t.num_nextn_predict_layers})"
            )
        algo = spec.get("quant_algo") if isinstance(spec, Mapping) else None
        if algo is not None and str(algo).upper() != "NVFP4":
            raise ConfigError(
                f"quantization_config.quantized_layers[{key!r}].quant_algo = {algo!r}, expected 'NVFP4'"
            )
        group = spec.get("group_size", NV_BLOCK) if isinstance(spec, Mapping) else NV_BLOCK
        if group != NV_BLOCK:
            raise ConfigError(
                f"quantization_config.quantized_layers[{key!r}].group_size = {group}, expected {NV_BLOCK}"
            )
        prefixes.add(key)
    return prefixes


def engram_table_formats(config: V41Config) -> dict[int, str]:
    """Engram layer id -> ``fp8`` (official), ``mxfp4`` or ``nvfp4`` (`engram_embed_quant`,
    MODEL.md §8.4).

    `engram_embed_layers` lists the converted layers; absent means all of them.
    """
    t, quant = config.text, config.quantization
    official = engram_formats.FP8.name  # the release's tables; absent means these
    fmt = (quant.engram_embed_quant or official).lower() if quant else official
    if fmt not in ENGRAM_FORMATS:
        raise ConfigError(
            f"quantization_config.engram_embed_quant = {fmt!r}, expected one of {list(ENGRAM_FORMATS)}"
        )
    if fmt == official:
        return {layer: official for layer in t.engram_layer_ids}
    assert quant is not None
    block, expected = quant.engram_embed_block_size, engram_formats.engram_format(fmt).scale_block
    if block is not None and block != expected:
        raise ConfigError(
            f"quantization_config.engram_embed_block_size = {block}, expected {expected} for "
            f"engram_embed_quant = {fmt!r}"
        )
    layers = quant.engram_embed_layers
    chosen = set(t.engram_layer_ids) if layers is None else set(layers)
    unknown = chosen - set(t.engram_layer_ids)
    if unknown:
        raise ConfigError(
            f"quantization_config.engram_embed_layers names {sorted(unknown)}, which are not Engram "
            f"layers (text_config.engram_layer_ids = {list(t.engram_layer_ids)})"
        )
    return {layer: (fmt if layer in chosen else official) for layer in t.engram_layer_ids}


def summarize_engram_formats(formats: Mapping[int, str]) -> str:
    kinds = set(formats.values())
    if not kinds:
        return "none"
    if len(kinds) == 1:
        return kinds.pop()
    return "mixed (" + ", ".join(f"layer {k}: {v}" for k, v in sorted(formats.items())) + ")"


# --- consistency checks that the config parser cannot make alone -------------------------------


def _check_config(config: V41Config) -> None:
    """Refuse configs whose fields contradict each other in ways that change the tensor layout."""
    t, quant = config.text, config.quantization
    problems = []
    if quant is not None:
        if quant.quant_method.lower() != "fp8":
            problems.append(f"quantization_config.quant_method = {quant.quant_method!r}, expected 'fp8'")
        if list(quant.weight_block_size) != [FP8_BLOCK, FP8_BLOCK]:
            problems.append(
                f"quantization_config.weight_block_size = {list(quant.weight_block_size)}, "
                f"expected [{FP8_BLOCK}, {FP8_BLOCK}]"
            )
        if quant.scale_fmt.lower() != "ue8m0":
            problems.append(f"quantization_config.scale_fmt = {quant.scale_fmt!r}, expected 'ue8m0'")
        if quant.expert_dtype.lower() != "fp4":
            problems.append(f"quantization_config.expert_dtype = {quant.expert_dtype!r}, expected 'fp4'")
        if quant.group_size is not None and release_variant(quant) == NVFP4 and quant.group_size != NV_BLOCK:
            problems.append(f"quantization_config.group_size = {quant.group_size}, expected {NV_BLOCK}")
    if t.num_key_value_heads != 1:
        problems.append(
            f"text_config.num_key_value_heads = {t.num_key_value_heads}, V4.1 shares one K=V latent (1)"
        )
    if t.num_attention_heads * t.head_dim % t.o_groups:
        problems.append("text_config.num_attention_heads * head_dim is not divisible by o_groups")
    for key in ("hidden_size", "moe_intermediate_size", "engram_head_dim"):
        value = getattr(t, key)
        if value % MX_BLOCK:
            problems.append(f"text_config.{key} = {value} is not a multiple of {MX_BLOCK} (4-bit block size)")
    if t.num_nextn_predict_layers and len(t.dspark_target_layer_ids) == 0:
        problems.append("text_config.num_nextn_predict_layers > 0 but dspark_target_layer_ids is empty")
    if problems:
        raise ConfigError(f"{config.source}: config contradicts itself: " + "; ".join(problems))
    if t.engram_layer_ids:
        from sglang_ds41.engram.layout import EngramLayout

        try:
            EngramLayout.from_config(t)
        except ConfigError:
            raise
        except Exception as error:  # the layout module raises Ds41Error
            raise ConfigError(f"{config.source}: {error}") from None


# --- the tensor list ---------------------------------------------------------------------------


class _Builder:
    def __init__(self) -> None:
        self.out: list[TensorSpec] = []
        self.group = BACKBONE

    def plain(self, name: str, dtype: str, *shape: int) -> None:
        fmt = {"BF16": "bf16", "F32": "f32"}[dtype]
        self.out.append(TensorSpec(name, dtype, tuple(shape), fmt, "param", self.group))

    def fp8(self, prefix: str, out: int, inp: int) -> None:
        scale = (-(-out // FP8_BLOCK), -(-inp // FP8_BLOCK))
        self.out.append(TensorSpec(f"{prefix}.weight", "F8_E4M3", (out, inp), "fp8", "weight", self.group))
        self.out.append(TensorSpec(f"{prefix}.scale", "F8_E8M0", scale, "fp8", "scale", self.group))

    def mxfp4(self, prefix: str, out: int, inp: int) -> None:
        g, codes = self.group, (out, inp // 2)
        self.out.append(TensorSpec(f"{prefix}.weight", "I8", codes, "mxfp4", "weight", g, _PACKED_DTYPES))
        self.out.append(
            TensorSpec(f"{prefix}.scale", "F8_E8M0", (out, inp // MX_BLOCK), "mxfp4", "scale", self.group)
        )

    def nvfp4(self, prefix: str, out: int, inp: int) -> None:
        g = self.group
        codes = (out, inp // 2)
        self.out.append(TensorSpec(f"{prefix}.weight", "U8", codes, "nvfp4", "weight", g, _PACKED_DTYPES))
        self.out.append(
            TensorSpec(
                f"{prefix}.weight_scale", "F8_E4M3", (out, inp // NV_BLOCK), "nvfp4", "weight_scale", g
            )
        )
        self.out.append(TensorSpec(f"{prefix}.weight_scale_2", "F32", (), "nvfp4", "weight_scale_2", g))
        self.out.append(TensorSpec(f"{prefix}.input_scale", "F32", (), "nvfp4", "input_scale", g))

    def engram_table(self, prefix: str, rows: int, width: int, fmt: str) -> None:
        """The table's tensors as `formats.engram` declares them; role = the part's name."""
        table = engram_formats.engram_format(fmt)
        for part, shape in table.shapes(rows, width).items():
            name = engram_formats.tensor_name(prefix, part)
            also = tuple(d for d in part.accepted if d != part.dtype)
            self.out.append(
                TensorSpec(name, part.dtype, shape, ENGRAM_PREFIX + fmt, part.name, ENGRAM_TABLES, also)
            )


def _attention(b: _Builder, p: str, t: TextConfig) -> None:
    d, heads, hd = t.hidden_size, t.num_attention_heads, t.head_dim
    b.plain(f"{p}.attn.attn_sink", "F32", heads)
    b.plain(f"{p}.attn.q_norm.weight", "BF16", t.q_lora_rank)
    b.plain(f"{p}.attn.kv_norm.weight", "BF16", hd)
    b.fp8(f"{p}.attn.wq_a", t.q_lora_rank, d)
    b.fp8(f"{p}.attn.wq_b", heads * hd, t.q_lora_rank)
    b.fp8(f"{p}.attn.wkv", hd, d)
    b.fp8(f"{p}.attn.wo_a", t.o_groups * t.o_lora_rank, heads * hd // t.o_groups)
    b.fp8(f"{p}.attn.wo_b", d, t.o_groups * t.o_lora_rank)
    b.plain(f"{p}.attn_norm.weight", "BF16", d)
    b.plain(f"{p}.ffn_norm.weight", "BF16", d)


def _hyper_connections(b: _Builder, p: str, t: TextConfig) -> None:
    hc = t.hc_mult
    for site in ("attn", "ffn"):
        b.plain(f"{p}.hc_{site}_fn", "F32", (2 + hc) * hc, hc * t.hidden_size)
        b.plain(f"{p}.hc_{site}_base", "F32", (2 + hc) * hc)
        b.plain(f"{p}.hc_{site}_scale", "F32", 3)


def _moe(b: _Builder, p: str, t: TextConfig, n_experts: int, expert_format: str) -> None:
    d, inter = t.hidden_size, t.moe_intermediate_size
    b.plain(f"{p}.ffn.gate.weight", "BF16", n_experts, d)
    b.plain(f"{p}.ffn.gate.bias", "F32", n_experts)
    b.plain(f"{p}.ffn.gate.bias_vl", "F32", n_experts)
    shared = inter * t.n_shared_experts
    b.fp8(f"{p}.ffn.shared_experts.w1", shared, d)
    b.fp8(f"{p}.ffn.shared_experts.w2", d, shared)
    b.fp8(f"{p}.ffn.shared_experts.w3", shared, d)
    write = b.nvfp4 if expert_format == "nvfp4" else b.mxfp4
    outer = b.group
    if outer == BACKBONE:
        b.group = ROUTED_EXPERTS
    for e in range(n_experts):
        write(f"{p}.ffn.experts.{e}.w1", inter, d)
        write(f"{p}.ffn.experts.{e}.w2", d, inter)
        write(f"{p}.ffn.experts.{e}.w3", inter, d)
    b.group = outer


def _layer(b: _Builder, layer: int, t: TextConfig, expert_format: str, engram_format: str | None) -> None:
    p = f"layers.{layer}"
    d, hd = t.hidden_size, t.head_dim
    _attention(b, p, t)
    if layer in t.kv_source_layer_ids:
        b.plain(f"{p}.attn.compressor.wkv.weight", "BF16", hd, d)
        if t.compress_ratios[layer] == 2:
            b.plain(f"{p}.attn.compressor.wgate.weight", "BF16", hd, d)
        b.plain(f"{p}.attn.compressor.norm.weight", "BF16", hd)
        b.plain(f"{p}.attn.indexer.wk.weight", "BF16", t.index_head_dim, hd)
        b.plain(f"{p}.attn.indexer.k_norm.weight", "BF16", t.index_head_dim)
    if layer in t.index_source_layer_ids:
        b.fp8(f"{p}.attn.indexer.wq_b", t.index_n_heads * t.index_head_dim, t.q_lora_rank)
        b.plain(f"{p}.attn.indexer.weights_proj.weight", "BF16", t.index_n_heads, d)
    if engram_format is not None:
        rows = t.engram_num_embeddings[t.engram_layer_ids.index(layer)]
        n_columns = (t.engram_max_ngram_size - 1) * t.engram_n_heads
        b.engram_table(f"{p}.engram", rows, t.engram_head_dim, engram_format)
        b.fp8(f"{p}.engram.wkv", (t.hc_mult + 1) * d, n_columns * t.engram_head_dim)
        b.plain(f"{p}.engram.q_weight", "BF16", t.hc_mult, d)
        b.plain(f"{p}.engram.k_weight", "BF16", t.hc_mult, d)
    _hyper_connections(b, p, t)
    _moe(b, p, t, t.n_routed_experts, expert_format)


def _dspark(b: _Builder, t: TextConfig, nvfp4_prefixes: set[str]) -> None:
    b.group = DSPARK
    d, last = t.hidden_size, t.num_nextn_predict_layers - 1
    for s in range(t.num_nextn_predict_layers):
        p = f"mtp.{s}"
        if s == 0:
            b.fp8(f"{p}.main_proj", d, len(t.dspark_target_layer_ids) * d)
            b.plain(f"{p}.main_norm.weight", "BF16", d)
        _attention(b, p, t)
        _hyper_connections(b, p, t)
        fmt = "nvfp4" if f"{p}.ffn.experts" in nvfp4_prefixes else "mxfp4"
        _moe(b, p, t, t.dspark_n_routed_experts, fmt)
        if s == last:
            b.plain(f"{p}.norm.weight", "BF16", d)
            b.plain(f"{p}.markov_head.embed.weight", "BF16", t.vocab_size, t.dspark_markov_rank)
            b.plain(f"{p}.markov_head.head.weight", "BF16", t.vocab_size, t.dspark_markov_rank)
            b.plain(f"{p}.confidence_head.proj.weight", "BF16", 1, d + t.dspark_markov_rank)


def _vision(b: _Builder, config: V41Config) -> None:
    v, d = config.vision, config.text.hidden_size
    assert v is not None
    b.group = VISION
    h, inter = v.hidden_size, v.intermediate_size
    b.plain("vision.patch_embed.proj.weight", "BF16", h, 3 * v.patch_size**2)
    b.plain("vision.patch_embed.proj.bias", "BF16", h)
    for i in range(v.num_hidden_layers):
        p = f"vision.blocks.{i}"
        b.plain(f"{p}.attn.wqkv.weight", "BF16", 3 * h, h)
        b.plain(f"{p}.attn.wqkv.bias", "BF16", 3 * h)
        b.plain(f"{p}.attn.wo.weight", "BF16", h, h)
        b.plain(f"{p}.attn.wo.bias", "BF16", h)
        b.plain(f"{p}.mlp.w1.weight", "BF16", 2 * inter, h)
        b.plain(f"{p}.mlp.w2.weight", "BF16", h, inter)
        b.plain(f"{p}.norm1.weight", "BF16", h)
        b.plain(f"{p}.norm2.weight", "BF16", h)
    b.plain("vision.norm.weight", "BF16", h)
    b.plain("aligner.w1.weight", "BF16", d, h * v.downsample_ratio**2)
    b.plain("aligner.w1.bias", "BF16", d)
    b.plain("aligner.w2.weight", "BF16", d, d)
    b.plain("aligner.w2.bias", "BF16", d)


def build_manifest(config: V41Config) -> Manifest:
    """All tensors of the checkpoint `config` describes (variant and Engram format included)."""
    _check_config(config)
    t = config.text
    variant = release_variant(config.quantization)
    nv = nvfp4_expert_prefixes(config)
    engram = engram_table_formats(config)
    b = _Builder()
    b.plain("embed.weight", "BF16", t.vocab_size, t.hidden_size)
    b.plain("head.weight", "BF16", t.vocab_size, t.hidden_size)
    b.plain("norm.weight", "BF16", t.hidden_size)
    if config.vision is not None:
        for name in ("image_start", "image_end", "image_newline"):
            b.plain(name, "BF16", t.hidden_size)
    for layer in range(t.num_hidden_layers):
        fmt = "nvfp4" if f"layers.{layer}.ffn.experts" in nv else "mxfp4"
        _layer(b, layer, t, fmt, engram.get(layer))
    _dspark(b, t, nv)
    if config.vision is not None:
        _vision(b, config)
    return Manifest(tuple(b.out), variant, summarize_engram_formats(engram), engram)
