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
from pathlib import Path

from sglang_ds41.checkpoint.manifest import engram_table_formats
from sglang_ds41.config import V41Config
from sglang_ds41.engram.gather import Quant
from sglang_ds41.errors import Ds41Error


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
def engram_formats(model_path: str, revision: str | None = None) -> dict[int, Quant]:
    """Engram layer id -> table format for the checkpoint at `model_path`."""
    config = V41Config.from_file(config_file(model_path, revision))
    return {layer: Quant(fmt) for layer, fmt in engram_table_formats(config).items()}
