"""Which attention role a layer plays in the cross-layer shared KV schedule (MODEL.md §1.3).

* WINDOW  (ratio 0): sliding window only.
* FULL    (KV source): owns a compressor and the index keys, runs its own indexer.
* REINDEX (index source, not KV source): own indexer queries over `kv_source`'s keys.
* REUSE   (neither): attends `kv_source`'s compressed cache with `index_source`'s top-k.
"""

from __future__ import annotations

import enum

from sglang_ds41.config import TextConfig


class LayerRole(enum.Enum):
    WINDOW = "window"
    FULL = "full"
    REINDEX = "reindex"
    REUSE = "reuse"


def layer_role(cfg: TextConfig, layer: int) -> LayerRole:
    if cfg.compress_ratios[layer] == 0:
        return LayerRole.WINDOW
    if layer in cfg.kv_source_layer_ids:
        return LayerRole.FULL
    if layer in cfg.index_source_layer_ids:
        return LayerRole.REINDEX
    return LayerRole.REUSE


def kv_source(cfg: TextConfig, layer: int) -> int:
    """The largest KV source <= layer (the config validator guarantees one in the ratio run)."""
    return max(s for s in cfg.kv_source_layer_ids if s <= layer)


def index_source(cfg: TextConfig, layer: int) -> int:
    return max(s for s in cfg.index_source_layer_ids if s <= layer)


def consumes_candidates(cfg: TextConfig, layer: int) -> bool:
    """Index sources after the candidate source restrict their top-k to its published blocks.

    Blocks number the candidate source's compressed entries, so only layers reading that same
    cache can use them (true of every consumer in the official schedule)."""
    source = cfg.candidate_source_layer_id
    return (
        layer in cfg.index_source_layer_ids and layer > source and kv_source(cfg, layer) == source
    )
