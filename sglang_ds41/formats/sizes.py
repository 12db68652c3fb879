"""Bytes per stored row of a block-scaled format (the arithmetic behind `engram`'s row sizes).

A row of ``cols`` values is its value bytes (FP8: one per value; MXFP4 / NVFP4: two E2M1 codes
per byte) followed by one scale byte per block (E8M0 per 32 for FP8 and MXFP4, E4M3 per 16 for
NVFP4). For the official Engram head dim of 256 that is 256 + 8 = 264 B (FP8), 128 + 8 = 136 B
(MXFP4) and 128 + 16 = 144 B (NVFP4) per row (MODEL.md §8.4); NVFP4's FP32 ``weight_scale_2``
is one per tensor, not per row, so it is not counted here.

``value_bytes`` and ``scale_bytes`` are plain arithmetic on ``cols``, as their callers' shape
checks always were; ``bytes_per_row`` also refuses a ``cols`` that is not a multiple of the block.
No torch: the torch-free planners (`engram.plan`, `checkpoint.manifest`) use it too.
"""

from __future__ import annotations

from .checks import FormatError, require_multiple

# Values per scale byte: E8M0 per 32 for an FP8 row (the 1x32 blocks of `fp8.quantize_fp8_rows`)
# and for MXFP4, E4M3 per 16 for NVFP4; `mxfp4.BLOCK` and `nvfp4.BLOCK` are read from here.
SCALE_BLOCK = {"fp8": 32, "mxfp4": 32, "nvfp4": 16}


def scale_block(format: str) -> int:
    """Values per scale byte: 32 (FP8, MXFP4) or 16 (NVFP4)."""
    try:
        return SCALE_BLOCK[format]
    except KeyError:
        raise FormatError(f"unknown format {format!r}; expected one of {sorted(SCALE_BLOCK)}") from None


def value_bytes(format: str, cols: int) -> int:
    """Bytes of a row's values: ``cols`` (FP8) or ``cols // 2`` (MXFP4, NVFP4: two codes a byte)."""
    scale_block(format)  # refuses an unknown format
    return cols if format == "fp8" else cols // 2


def scale_bytes(format: str, cols: int) -> int:
    """Bytes of a row's block scales: ``cols // scale_block(format)``."""
    return cols // scale_block(format)


def bytes_per_row(format: str, cols: int) -> int:
    """Row bytes: fp8 = cols + cols/32; mxfp4 = cols/2 + cols/32; nvfp4 = cols/2 + cols/16."""
    require_multiple(cols, scale_block(format), f"bytes_per_row({format!r})", dim="cols")
    return value_bytes(format, cols) + scale_bytes(format, cols)
