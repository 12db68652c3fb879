"""Quantisation-aware training: every weight is seen in its checkpoint format from the start.

The exported checkpoint stores FP8 32x32-block linears, MXFP4 routed experts, BF16 norms and
embeddings and FP8 Engram rows (docs/MODEL.md §8). A tiny model is fragile to that rounding,
so training runs each weight through the same quantise + dequantise the export and the loader
apply (`formats`), with straight-through gradients onto a float32 master copy. The exported
tensors are then exactly the ones the forward was trained with, and a loaded checkpoint
computes what the trainer computed (to float rounding).

Formats come from the checkpoint manifest of the config, by the parameter's checkpoint name,
so this module decides nothing about which tensor has which format. The rounding can be off
for the first part of a run (`set_rounding`; `Settings.qat_from`): a float warm-up learns
faster, and the rest of the run adapts the model to its formats before export.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn
from torch.nn.utils import parametrize

from sglang_ds41 import formats
from sglang_ds41.checkpoint.load import checkpoint_name
from sglang_ds41.checkpoint.manifest import Manifest
from sglang_ds41.formats.straight_through import straight_through


def _fp8_block(w: torch.Tensor) -> torch.Tensor:
    return formats.dequantize_fp8_block2d(*formats.quantize_fp8_block2d(w), dtype=w.dtype)


def _mxfp4(w: torch.Tensor) -> torch.Tensor:
    return formats.dequantize_mxfp4(*formats.quantize_mxfp4(w), dtype=w.dtype)


def _bf16(w: torch.Tensor) -> torch.Tensor:
    return w.to(torch.bfloat16).to(w.dtype)


def fp8_rows(w: torch.Tensor) -> torch.Tensor:
    """Engram table rows as the FP8 release stores them (E4M3 + E8M0 per 32)."""
    return formats.dequantize_fp8_rows(*formats.quantize_fp8_rows(w), dtype=w.dtype)


ROUNDING: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "fp8": straight_through(_fp8_block),
    "mxfp4": straight_through(_mxfp4),
    "nvfp4": straight_through(_mxfp4),  # the NVFP4 release re-encodes the MXFP4 experts losslessly
    "bf16": straight_through(_bf16),
    "engram_fp8": straight_through(fp8_rows),
}


# The formats that round each value alone, so rows can be rounded apart from their matrix.
ELEMENTWISE = frozenset({"bf16"})


class Rounded(nn.Module):
    """A parametrization: the master weight as its checkpoint format stores it (while `on`)."""

    def __init__(self, fmt: str):
        super().__init__()
        self.fmt, self.on = fmt, True

    def forward(self, w: torch.Tensor) -> torch.Tensor:
        return ROUNDING[self.fmt](w) if self.on else w


def round_rows(module: nn.Module, rows: torch.Tensor) -> torch.Tensor:
    """Rows of `module`'s master weight as its checkpoint format stores them, when that format
    rounds each value alone (`ELEMENTWISE`): the values of the same rows of the rounded whole
    matrix, with the same gradient (straight through), without rounding the whole matrix."""
    if not parametrize.is_parametrized(module, "weight"):
        return rows
    (rounding,) = module.parametrizations.weight
    if rounding.fmt not in ELEMENTWISE:
        raise ValueError(f"round_rows needs a format that rounds each value; {rounding.fmt!r} rounds blocks")
    return rounding(rows)


def set_rounding(model: nn.Module, on: bool) -> None:
    """Turn the rounding of every `Rounded` parametrization of `model` on or off."""
    for module in model.modules():
        if isinstance(module, Rounded):
            module.on = on


def round_like_checkpoint(model: nn.Module, manifest: Manifest) -> list[str]:
    """Parametrize every parameter of `model` whose checkpoint format rounds (F32 ones do not);
    returns the checkpoint names of those parameters."""
    done = []
    for name, _ in list(model.named_parameters()):
        fmt = manifest.format_of(checkpoint_name(name).removesuffix(".weight"))
        if fmt not in ROUNDING:
            continue
        owner_name, _, leaf = name.rpartition(".")
        owner = model.get_submodule(owner_name) if owner_name else model
        parametrize.register_parametrization(owner, leaf, Rounded(fmt))
        done.append(checkpoint_name(name))
    return done


def master_weights(model: nn.Module) -> dict[str, torch.Tensor]:
    """Parameter name (as the unparametrized module names it) -> float32 master tensor."""
    out = {}
    for name, p in model.named_parameters():
        out[name.replace(".parametrizations.", ".").removesuffix(".original")] = p.detach()
    return out
