"""Helpers to build and load upstream SGLang's Engram layer the way a server process does."""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import torch
from safetensors import safe_open


def upstream_config(ckpt: Path):
    """The HF config upstream builds the model from (its V4.1 class normalises the nested form)."""
    from sglang.srt.configs.deepseek_v41 import DeepseekV41Config

    return DeepseekV41Config(**json.loads((ckpt / "config.json").read_text()))


def checkpoint_tensor(ckpt: Path, name: str) -> torch.Tensor:
    weight_map = json.loads((ckpt / "model.safetensors.index.json").read_text())["weight_map"]
    with safe_open(str(ckpt / weight_map[name]), framework="pt") as f:
        return f.get_tensor(name)


@contextmanager
def serving(ckpt: Path, tp_size: int = 1, tp_rank: int = 0) -> Iterator[None]:
    """The runtime context of TP rank `tp_rank` of a server for `ckpt`."""
    from sglang.srt.runtime_context import get_context, get_parallel

    with (
        get_context().override_server_args(model_path=str(ckpt), tp_size=tp_size),
        get_parallel().override(tp_size=tp_size, tp_rank=tp_rank),
    ):
        yield


def load_table(embed, ckpt: Path, layer: int, codes_dtype: torch.dtype | None = None) -> None:
    """Feed every table tensor of the layer in the checkpoint (FP8 / MXFP4: weight + scale; NVFP4:
    weight + weight_scale + weight_scale_2) to the parameter of that name, as `load_weights` does."""
    prefix = f"layers.{layer}.engram.embed."
    weight_map = json.loads((ckpt / "model.safetensors.index.json").read_text())["weight_map"]
    params = dict(embed.named_parameters())
    parts = sorted(name.removeprefix(prefix) for name in weight_map if name.startswith(prefix))
    assert sorted(params) == parts, f"checkpoint tensors {parts}, module parameters {sorted(params)}"
    for part in parts:
        tensor = checkpoint_tensor(ckpt, prefix + part)
        if part == "weight" and codes_dtype is not None:
            tensor = tensor.view(codes_dtype)
        params[part].weight_loader(params[part], tensor)
