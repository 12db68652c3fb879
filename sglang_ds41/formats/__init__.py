"""Quantisation formats of the V4.1 checkpoints and caches: pure tensor functions, any device.

Modules: ``e2m1`` / ``e8m0`` (element and scale codes), ``fp8`` (E4M3 + E8M0, 32x32 and 1x32
blocks), ``mxfp4`` (OCP or least-squares scales), ``nvfp4`` (ModelOpt layout; also the NVFP4
Engram table format), ``kv_quant`` (the model's KV fake-quantisers),
``sizes`` (bytes per row: values and block scales), ``engram`` (the Engram table formats:
names, tensors, dtypes, sizes and decoders, declared once for every module that handles tables).

``sizes``, ``engram`` and ``FormatError`` need no torch, and importing this package does not
import it: the tensor functions below are loaded on first use, so torch-free modules (the Engram
planner, the checkpoint manifest) can read the table formats.
"""

from __future__ import annotations

import importlib
from typing import Any

from .checks import FormatError
from .sizes import bytes_per_row, scale_block, scale_bytes, value_bytes

_LAZY = {
    "dequantize_fp8_block2d": "fp8",
    "dequantize_fp8_rows": "fp8",
    "quantize_fp8_block2d": "fp8",
    "quantize_fp8_rows": "fp8",
    "dequantize_mxfp4": "mxfp4",
    "fp8_rows_to_mxfp4": "mxfp4",
    "quantize_mxfp4": "mxfp4",
    "dequantize_nvfp4": "nvfp4",
    "fp8_rows_global_scale": "nvfp4",
    "fp8_rows_to_nvfp4": "nvfp4",
    "mxfp4_to_nvfp4": "nvfp4",
    "quantize_nvfp4": "nvfp4",
}
_SUBMODULES = ("checks", "e2m1", "e8m0", "engram", "fp8", "kv_quant", "mxfp4", "nvfp4", "sizes")

__all__ = [
    "FormatError",
    "bytes_per_row",
    "dequantize_fp8_block2d",
    "dequantize_fp8_rows",
    "dequantize_mxfp4",
    "dequantize_nvfp4",
    "fp8_rows_global_scale",
    "fp8_rows_to_mxfp4",
    "fp8_rows_to_nvfp4",
    "mxfp4_to_nvfp4",
    "quantize_fp8_block2d",
    "quantize_fp8_rows",
    "quantize_mxfp4",
    "quantize_nvfp4",
    "scale_block",
    "scale_bytes",
    "value_bytes",
]


def __getattr__(name: str) -> Any:
    if name in _SUBMODULES:
        return importlib.import_module(f"{__name__}.{name}")
    if name in _LAZY:
        value = getattr(importlib.import_module(f"{__name__}.{_LAZY[name]}"), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *_LAZY, *_SUBMODULES})
