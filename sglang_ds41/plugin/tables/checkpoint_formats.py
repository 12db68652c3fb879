"""Which table format each Engram layer of the served checkpoint uses, from its config.json.

Upstream builds `EngramEmbedding(num_embeddings, dim, layer_id, column_bounds)` without the
model config, but the table must be allocated in its format before any tensor is read. The
format is the checkpoint's declaration (`quantization_config.engram_embed_quant`, and
`engram_embed_layers` for a partial conversion; see `checkpoint.manifest.engram_table_formats`),
read once per process from the checkpoint SGLang serves; the loader then cross-checks every
table tensor against it.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path

from sglang_ds41.checkpoint.manifest import engram_table_formats
from sglang_ds41.config import V41Config
from sglang_ds41.errors import Ds41Error
from sglang_ds41.formats.engram import TABLE, EngramFormat, engram_format


def config_file(model_path: str, revision: str | None = None) -> Path:
    """The checkpoint's config.json: in the directory, else in the local Hugging Face cache."""
    local = Path(model_path)
    if local.is_dir():
        path = local / "config.json"
        if not path.is_file():
            raise Ds41Error(f"{model_path}: no config.json, so the Engram table format is unknown")
        return path
    try:
        from huggingface_hub import hf_hub_download

        return Path(hf_hub_download(model_path, "config.json", revision=revision))
    except Exception as error:  # any hub/cache failure: say what we looked for
        raise Ds41Error(
            f"{model_path}: not a local checkpoint directory and its config.json is not in the Hugging "
            f"Face cache ({error}); the Engram table format cannot be read"
        ) from error


@functools.cache
def engram_formats(model_path: str, revision: str | None = None) -> dict[int, EngramFormat]:
    """Engram layer id -> table format for the checkpoint at `model_path`."""
    config = V41Config.from_file(config_file(model_path, revision))
    return {layer: engram_format(fmt) for layer, fmt in engram_table_formats(config).items()}


TABLE_PART = f".engram.{TABLE}."


@functools.cache
def stored_table_tensors(model_path: str) -> dict[str, tuple[str, tuple[int, ...]]]:
    """`layers.L.engram.embed.<part>` -> (safetensors dtype, shape), from the shard headers only;
    empty when `model_path` is not a local directory (the loader still checks every tensor)."""
    from safetensors import safe_open

    root = Path(model_path)
    index = root / "model.safetensors.index.json"
    if index.is_file():
        weight_map = json.loads(index.read_text())["weight_map"]
        files = sorted({root / f for n, f in weight_map.items() if TABLE_PART in n})
    elif root.is_dir():
        files = sorted(root.glob("*.safetensors"))
    else:
        return {}
    found = {}
    for path in files:
        with safe_open(str(path), framework="pt") as f:
            for name in f.keys():  # noqa: SIM118 - safe_open has no __iter__
                if TABLE_PART in name:
                    piece = f.get_slice(name)
                    found[name] = (piece.get_dtype(), tuple(piece.get_shape()))
    return found
