"""Bytes per stored row for each table/weight format (payload only, per row)."""

from __future__ import annotations

from .checks import FormatError, require_multiple

_BLOCK = {"fp8": 32, "mxfp4": 32, "nvfp4": 16}


def bytes_per_row(format: str, cols: int) -> int:
    """Row bytes: fp8 = cols + cols/32; mxfp4 = cols/2 + cols/32; nvfp4 = cols/2 + cols/16.

    NVFP4's FP32 ``weight_scale_2`` is one per tensor, not per row, so it is not counted here.
    """
    if format not in _BLOCK:
        raise FormatError(f"bytes_per_row: unknown format {format!r}; expected one of {sorted(_BLOCK)}")
    block = _BLOCK[format]
    require_multiple(cols, block, f"bytes_per_row({format!r})", dim="cols")
    payload = cols if format == "fp8" else cols // 2
    return payload + cols // block
