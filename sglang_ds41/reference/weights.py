"""Build the reference `Transformer` from a checkpoint directory (MODEL.md §8).

Everything goes through the shared reader (`checkpoint.Checkpoint`): the directory is validated
against the manifest first, then every parameter is read by its official name and dequantised
to a dense tensor — FP8 32x32 block linears, MXFP4 or NVFP4 routed experts (W4A16: NVFP4's
`input_scale` only matters to W4A4 kernels). Engram tables stay quantised in an `EngramTable`
(FP8 or MXFP4 rows, dequantised per lookup). The vision tower, aligner and DSpark stages are
not part of the reference model and are left unread.

Names (§8.6): model parameters carry the checkpoint names, except that a `HyperConnection`
holds `fn/base/scale` for `hc_{attn,ffn}_{fn,base,scale}`. Afterwards every language-model
tensor of the checkpoint must have been used, so a mapping mistake fails loudly by name.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from pathlib import Path

import torch

from sglang_ds41.checkpoint.reader import Checkpoint, CheckpointError
from sglang_ds41.engram.hashing import EngramHasher
from sglang_ds41.engram.table import EngramTable

from .model import Transformer

# Checkpoint tensors the reference model does not run (vision tower, aligner, DSpark).
UNUSED_PREFIXES = ("vision.", "aligner.", "mtp.")

# Stored tensors that belong to one weight, by storage format.
COMPANIONS = {
    "fp8": (".weight", ".scale"),
    "mxfp4": (".weight", ".scale"),
    "nvfp4": (".weight", ".weight_scale", ".weight_scale_2", ".input_scale"),
}

_HC = re.compile(r"\.hc_(attn|ffn)\.(fn|base|scale)$")


def checkpoint_name(param: str) -> str:
    """`layers.3.hc_attn.fn` -> `layers.3.hc_attn_fn`; every other name is the checkpoint's."""
    return _HC.sub(r".hc_\1_\2", param)


def fill_dense_parameters(
    ckpt: Checkpoint,
    named_parameters: Iterable[tuple[str, torch.nn.Parameter]],
    to_checkpoint_name: Callable[[str], str],
    dtype: torch.dtype,
    owner: str,
    shard: Callable[[str, torch.Tensor], torch.Tensor] | None = None,
) -> set[str]:
    """Set each parameter to its checkpoint tensor dequantised to `dtype` (F32-stored tensors stay
    float32 in a bfloat16 model); returns the stored tensor names used. Shared by the reference
    and the SGLang backend, so both runtimes read identical weights. `shard(name, tensor)` gives
    a TP rank its slice of the dequantised tensor."""
    manifest = ckpt.manifest
    used: set[str] = set()
    for param, p in named_parameters:
        name = to_checkpoint_name(param)
        prefix = name.removesuffix(".weight")
        fmt = manifest.format_of(prefix)
        if fmt is None:
            raise CheckpointError(
                f"{ckpt.root}: parameter {param} of {owner} expects checkpoint tensor {name}, which "
                "this checkpoint's layout does not have"
            )
        stored_dtype = manifest[name].dtype if name in manifest else None
        target = torch.float32 if stored_dtype == "F32" and dtype == torch.bfloat16 else dtype
        value = ckpt.dense(prefix, dtype=target)
        full_shape = list(value.shape)
        if shard is not None:
            value = shard(name, value)
        if tuple(value.shape) != tuple(p.shape):
            local = list(value.shape)
            sliced = f" (this TP rank's slice: {local})" if local != full_shape else ""
            raise CheckpointError(
                f"{ckpt.root}: tensor {name} dequantises to shape {full_shape}{sliced}, {owner} "
                f"expects {list(p.shape)} for {param}"
            )
        p.data = value
        used.update([prefix + s for s in COMPANIONS[fmt]] if fmt in COMPANIONS else [name])
    return used


def require_all_used(ckpt: Checkpoint, used: set[str], owner: str) -> None:
    """Every language-model tensor of the checkpoint was read: a name-mapping bug fails by name."""
    unused = [s.name for s in ckpt.manifest if s.name not in used and not s.name.startswith(UNUSED_PREFIXES)]
    if unused:
        raise CheckpointError(
            f"{ckpt.root}: {len(unused)} language-model tensors are not used by {owner} "
            f"(a name-mapping bug), e.g. {unused[:5]}"
        )


def load_reference(
    model_dir: str | Path,
    dtype: torch.dtype = torch.float32,
    token_map_cache: str | Path | None = None,
) -> Transformer:
    """The reference model of a checkpoint directory, weights dequantised to `dtype`.

    Tensors stored as F32 (hc parameters, sinks, router biases) stay float32 in a bfloat16
    model. `token_map_cache`: where the Engram token map is cached (see `engram.token_map`)."""
    ckpt = Checkpoint.open(model_dir)
    try:
        return _load(ckpt, dtype, token_map_cache)
    finally:
        ckpt.close()


def _load(ckpt: Checkpoint, dtype: torch.dtype, token_map_cache: str | Path | None) -> Transformer:
    config = ckpt.config
    tokenizer = ckpt.root / "tokenizer.json"
    if not tokenizer.is_file():
        from sglang_ds41.assets import TOKENIZER_JSON

        tokenizer = TOKENIZER_JSON
    hasher = EngramHasher.for_tokenizer(config, tokenizer, cache_dir=token_map_cache)
    model = Transformer(config, hasher)
    used = fill_dense_parameters(ckpt, model.named_parameters(), checkpoint_name, dtype, "the model")
    text = config.text
    for layer in text.engram_layer_ids:
        prefix = f"layers.{layer}.engram"
        table = EngramTable.from_safetensors(ckpt.root, prefix, pin=False, head_dim=text.engram_head_dim)
        model.layers[layer].engram.table = table
        used.update(table.tensor_names)
    require_all_used(ckpt, used, "the reference model")
    return model.requires_grad_(False).eval()
