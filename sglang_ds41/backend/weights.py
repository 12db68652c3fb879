"""Fill the SGLang backend's parameters from a checkpoint directory through the shared loader.

The backend's modules are the reference's (`model/`, `engram/`), so a parameter's checkpoint
name is its name without the SGLang-side `model.` prefix, mapped as every runtime maps it
(`checkpoint.load.checkpoint_name`): FP8 32x32 block linears, MXFP4 or NVFP4 routed experts
are dequantised to the compute dtype by `Checkpoint.dense`; Engram tables stay quantised in
host memory (`checkpoint.load.attach_engram_tables`), each TP rank holding its own rows only
(zero elsewhere; the model all-reduces the lookups).

TP: each rank keeps its slice of the dense tensors that MODEL.md §13 shards (`tp.py` says which
and how) and the whole of the others; the Engram tables, by far the largest tensors (§9.2), are
row-sharded on hash-column boundaries. Every error names the tensor.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import torch
from torch import nn

from sglang_ds41.checkpoint.load import (
    attach_engram_tables,
    checkpoint_name,
    fill_dense_parameters,
    require_all_used,
)
from sglang_ds41.checkpoint.reader import Checkpoint
from sglang_ds41.engram.layer import EngramLayer

from .tp import SINGLE, TensorParallel

# Prefix of the language model's parameters inside the SGLang model class (`self.model`).
MODEL_PREFIX = "model."


def backend_checkpoint_name(param: str) -> str:
    """`model.layers.3.hc_attn.fn` -> `layers.3.hc_attn_fn`; `head.weight` stays."""
    return checkpoint_name(param.removeprefix(MODEL_PREFIX))


def load_checkpoint(
    module: nn.Module,
    model_dir: str | Path,
    dtype: torch.dtype,
    engram_layers: Iterable[EngramLayer],
    tp: TensorParallel = SINGLE,
) -> list[str]:
    """Fill `module`'s parameters (and the `table` of each `EngramLayer` in `engram_layers`)
    from `model_dir`; returns the checkpoint tensor names used. Raises `CheckpointError`
    naming the tensor on a missing tensor, a shape mismatch, or an unused language-model tensor."""
    ckpt = Checkpoint.open(model_dir)
    try:
        used = fill_dense_parameters(
            ckpt, module.named_parameters(), backend_checkpoint_name, dtype, "the backend", tp.shard
        )
        used |= attach_engram_tables(ckpt, engram_layers, tp.rank, tp.size)
        require_all_used(ckpt, used, "the backend")
        return sorted(used)
    finally:
        ckpt.close()
