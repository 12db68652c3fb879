"""Checkpoint tensors -> module parameters, by name, for every runtime (MODEL.md §8).

The reference model (`reference/weights.py`), the SGLang backend (`backend/weights.py`) and the
vision tower (`vision/weights.py`) all load through these functions, so every runtime reads
identical weights. The directory is validated against the manifest when it is opened
(`Checkpoint.open`); then every parameter is read by its checkpoint name and dequantised to a
dense tensor (`fill_dense_parameters`: FP8 32x32 block linears, MXFP4 or NVFP4 routed experts;
W4A16, so NVFP4's `input_scale` only matters to W4A4 kernels); afterwards every tensor the module
should read must have been used (`require_all_used`), so a name-mapping mistake fails by name.

Names (§8.6): model parameters carry the checkpoint names, except that a `HyperConnection` holds
`fn/base/scale` for `hc_{attn,ffn}_{fn,base,scale}` (`checkpoint_name`).

Engram (§5): the tables stay quantised in host memory, one `EngramTable` per `EngramLayer`, each
TP rank holding its own rows on hash-column boundaries (`attach_engram_tables`); the hasher uses
the token map of the checkpoint's tokenizer (`engram_hasher`). `tokenizer_json` is the one
tokenizer lookup: the checkpoint's own `tokenizer.json`, else the packaged V4.1 one.

Importing this module is cheap (torch and the Engram modules are imported when used), so the
launcher can ask `tokenizer_json` without torch installed.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Collection, Iterable
from pathlib import Path
from typing import TYPE_CHECKING

from sglang_ds41.checkpoint.reader import Checkpoint, CheckpointError

if TYPE_CHECKING:
    import torch

    from sglang_ds41.config import V41Config
    from sglang_ds41.engram.hashing import EngramHasher
    from sglang_ds41.engram.layer import EngramLayer

# Checkpoint tensors the language model does not run (vision tower, aligner, DSpark).
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


def tokenizer_json(model_dir: str | Path) -> Path:
    """The tokenizer a checkpoint is served and hashed with: its own `tokenizer.json` if it ships
    one, else the packaged V4.1 tokenizer (`sglang_ds41.assets`)."""
    own = Path(model_dir) / "tokenizer.json"
    if own.is_file():
        return own
    from sglang_ds41.assets import TOKENIZER_JSON

    return TOKENIZER_JSON


def engram_hasher(
    config: V41Config, model_dir: str | Path, cache_dir: str | Path | None = None
) -> EngramHasher:
    """The Engram hasher of a checkpoint: the token map of its tokenizer (`tokenizer_json`; cached,
    see `engram.token_map`) and the config's layout."""
    from sglang_ds41.engram.hashing import EngramHasher

    return EngramHasher.for_tokenizer(config, tokenizer_json(model_dir), cache_dir=cache_dir)


def fill_dense_parameters(
    ckpt: Checkpoint,
    named_parameters: Iterable[tuple[str, torch.nn.Parameter]],
    to_checkpoint_name: Callable[[str], str],
    dtype: torch.dtype,
    owner: str,
    shard: Callable[[str, torch.Tensor], torch.Tensor] | None = None,
) -> set[str]:
    """Set each parameter to its checkpoint tensor dequantised to `dtype` (F32-stored tensors stay
    float32 in a bfloat16 model); returns the stored tensor names used. `shard(name, tensor)`
    gives a TP rank its slice of the dequantised tensor."""
    import torch

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


def attach_engram_tables(
    ckpt: Checkpoint, layers: Iterable[EngramLayer], tp_rank: int = 0, tp_size: int = 1
) -> set[str]:
    """Give each `EngramLayer` the table of its layer (`EngramLayer.layer`), read quantised into
    host memory: rank `tp_rank` of `tp_size` its rows on hash-column boundaries
    (`engram.table.shard_boundaries`), zero elsewhere; returns the stored tensor names used."""
    from sglang_ds41.engram.layout import EngramLayout
    from sglang_ds41.engram.table import EngramTable

    text = ckpt.config.text
    layout = EngramLayout.from_config(text)
    used: set[str] = set()
    for engram in layers:
        engram.table = EngramTable.from_safetensors(
            ckpt.root,
            f"layers.{engram.layer}.engram",
            column_starts=layout.layers[layout.index_of(engram.layer)].column_starts(),
            tp_rank=tp_rank,
            tp_size=tp_size,
            pin=False,
            head_dim=text.engram_head_dim,
        )
        used.update(engram.table.tensor_names)
    return used


def language_model_tensors(ckpt: Checkpoint) -> set[str]:
    """Every tensor of the checkpoint but the vision tower's, the aligner's and DSpark's."""
    return {s.name for s in ckpt.manifest if not s.name.startswith(UNUSED_PREFIXES)}


def require_all_used(
    ckpt: Checkpoint,
    used: set[str],
    owner: str,
    expected: Collection[str] | None = None,
    kind: str = "language-model",
) -> None:
    """Every tensor in `expected` (default: the language model's, `language_model_tensors`) was
    read, so a name-mapping bug fails by name."""
    wanted = language_model_tensors(ckpt) if expected is None else set(expected)
    unused = [s.name for s in ckpt.manifest if s.name in wanted and s.name not in used]
    if unused:
        raise CheckpointError(
            f"{ckpt.root}: {len(unused)} {kind} tensors are not used by {owner} "
            f"(a name-mapping bug), e.g. {unused[:5]}"
        )
