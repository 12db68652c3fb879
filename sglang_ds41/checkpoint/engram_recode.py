"""Re-encode Engram table rows between FP8 and MXFP4, on raw bytes (MODEL.md §8.4).

`formats.fp8_rows_to_mxfp4` is the definition, but it expands every value to float32 and runs
~25 MB/s on one core: 2 hours for the official 202 GB of tables. The same arithmetic collapses
to table look-ups, because within one 32-block every step is decided by two bytes:

* the block's MXFP4 exponent is ``s - 127 + floor(log2 max|v|) - 2`` (``s`` the FP8 scale byte),
  and E4M3 magnitudes order like their byte values, so ``max|v|`` is a max over bytes;
* each value is then ``fp8(byte) * 2**k`` with ``k = 2 - floor(log2 max|v|)`` in [-6, 11], so
  its E2M1 code is ``LUT[k][byte]`` (18 x 256 bytes, resident in L1).

numpy can only run that as separate passes with materialised index arrays (~250 MB/s of source
per core, slower than a disk), so the loop is compiled with numba (sglang pins it too): one pass
per row, ~1 GB/s per core, and it releases the GIL so `recode` spreads rows over threads.

The table is built by calling `formats.e2m1.encode` on exact float32 values, and rows holding a
block where the shortcut's premises fail (NaN values or scale, scale exponents that would clamp
or overflow float32) go through `formats.fp8_rows_to_mxfp4` itself, so the result is the
definition's bit for bit (tests compare exhaustively). The reverse direction, for tests, is
lossless and rare, so it simply calls the definitions.
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from functools import cache

import numba
import numpy as np
import torch

from sglang_ds41 import formats
from sglang_ds41.formats import e2m1

BLOCK = 32
_K_MIN, _K_MAX = -6, 11  # 2 - floor(log2 m) over E4M3 magnitudes m in [2**-9, 448]
_NAN_MAG = 0x7F  # E4M3fn NaN magnitude byte (0x7F / 0xFF)
# Scale bytes from here on can overflow float32 when dequantised (448 * 2**120 > float32 max);
# 255 is the NaN scale.
_OVERFLOW_SCALE = 247


@cache
def _tables() -> tuple[np.ndarray, np.ndarray]:
    """(floor(log2 |v|) per E4M3 byte as int32 [256], E2M1 code per (k - K_MIN, byte) uint8 [18, 256])."""
    values = torch.arange(256, dtype=torch.uint8).view(torch.float8_e4m3fn).float()
    _, exponent = torch.frexp(values.abs())
    floor_log2 = (exponent - 1).numpy().astype(np.int32)  # byte 0: -1, never used (zero block)
    codes = np.stack([e2m1.encode(values * 2.0**k).numpy() for k in range(_K_MIN, _K_MAX + 1)])
    return floor_log2, codes.astype(np.uint8)


# Rows per worker below which threads cost more than they save.
_MIN_ROWS_PER_WORKER = 4096


def compiled(fn):
    """numba's njit (GIL released) with its on-disk cache where it can write one, which saves
    ~0.3 s per process; without it where it cannot (read-only install and home): numba
    refuses `cache=True` at decoration time there, which would make this module unimportable."""
    try:
        return numba.njit(nogil=True, cache=True, boundscheck=False)(fn)
    except RuntimeError:  # "cannot cache function ...: no locator available"
        return numba.njit(nogil=True, boundscheck=False)(fn)


@compiled
def _fp8_rows_to_mxfp4(weight, scale, floor_log2, lut, codes, scales, fallback):
    """The look-up re-encoding of every row; flags in `fallback` the rows the definition must redo."""
    rows, width = weight.shape
    for r in range(rows):
        flagged = False
        for b in range(width // BLOCK):
            first = b * BLOCK
            s = np.int32(scale[r, b])
            flagged |= s >= _OVERFLOW_SCALE
            top = np.int32(0)
            for i in range(first, first + BLOCK):
                top = max(top, np.int32(weight[r, i] & 0x7F))
            if top == 0:  # the definition's all-zero block: scale byte 0, codes 0
                scales[r, b] = 0
                for j in range(first // 2, (first + BLOCK) // 2):
                    codes[r, j] = 0
                continue
            exponent = floor_log2[top]
            new_scale = s + exponent - 2
            flagged |= (top == _NAN_MAG) | (new_scale < 0) | (new_scale > 254)
            scales[r, b] = np.uint8(new_scale & 0xFF)
            k = 2 - exponent - _K_MIN
            for i in range(first, first + BLOCK, 2):  # low nibble = even column
                codes[r, i // 2] = lut[k, weight[r, i]] | (lut[k, weight[r, i + 1]] << 4)
        fallback[r] = flagged


def fp8_to_mxfp4(weight: np.ndarray, scale: np.ndarray, workers: int = 1) -> tuple[np.ndarray, np.ndarray]:
    """FP8 rows (uint8 [R, W] E4M3 bytes, uint8 [R, W/32] E8M0) -> MXFP4 (uint8 [R, W/2], [R, W/32]).

    Bit-identical to ``formats.fp8_rows_to_mxfp4``. With `workers` > 1 the rows are split over
    threads (the compiled loop releases the GIL), each filling its slice of the outputs."""
    rows, width = weight.shape
    if width % BLOCK or scale.shape != (rows, width // BLOCK):
        raise ValueError(
            f"FP8 rows {weight.shape} / scales {scale.shape}: expected [R, W] and [R, W/{BLOCK}]"
        )
    codes = np.empty((rows, width // 2), np.uint8)
    scales = np.empty((rows, width // BLOCK), np.uint8)
    fallback = np.empty(rows, np.bool_)
    tables = _tables()
    bounds = np.linspace(0, rows, max(1, min(workers, rows // _MIN_ROWS_PER_WORKER)) + 1).astype(int)

    def run(i: int) -> None:
        part = slice(bounds[i], bounds[i + 1])
        _fp8_rows_to_mxfp4(weight[part], scale[part], *tables, codes[part], scales[part], fallback[part])

    if len(bounds) == 2:
        run(0)
    else:
        list(_pool(len(bounds) - 1).map(run, range(len(bounds) - 1)))
    if fallback.any():
        idx = np.flatnonzero(fallback)
        ref_codes, ref_scales = formats.fp8_rows_to_mxfp4(
            torch.from_numpy(weight[idx]).view(torch.float8_e4m3fn),
            torch.from_numpy(scale[idx]).view(torch.float8_e8m0fnu),
        )
        codes[idx] = ref_codes.numpy()
        scales[idx] = ref_scales.view(torch.uint8).numpy()
    return codes, scales


def mxfp4_to_fp8(codes: np.ndarray, scale: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """MXFP4 rows (uint8 [R, W/2], [R, W/32]) -> FP8 rows (uint8 [R, W], [R, W/32]).

    Lossless: E2M1 values have two significant bits and a block spans at most 12x, well inside
    E4M3's normal range once rescaled to amax in (224, 448]."""
    exact = formats.dequantize_mxfp4(
        torch.from_numpy(codes), torch.from_numpy(scale).view(torch.float8_e8m0fnu), torch.float32
    )
    values, scales = formats.quantize_fp8_rows(exact)
    return values.view(torch.uint8).numpy(), scales.view(torch.uint8).numpy()


@cache
def _pool(workers: int) -> ThreadPoolExecutor:
    return ThreadPoolExecutor(workers, thread_name_prefix="engram-recode")


def default_workers() -> int:
    return max(1, min(8, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else 1))


def recode(to: str, weight: np.ndarray, scale: np.ndarray, workers: int = 1) -> tuple[np.ndarray, np.ndarray]:
    """Rows of the other format -> rows of `to` (``mxfp4`` or ``fp8``; `workers` threads for mxfp4)."""
    return fp8_to_mxfp4(weight, scale, workers) if to == "mxfp4" else mxfp4_to_fp8(weight, scale)


def decode(fmt: str, weight: np.ndarray, scale: np.ndarray) -> torch.Tensor:
    """Stored rows -> float32 values (for verification)."""
    w, s = torch.from_numpy(weight), torch.from_numpy(scale).view(torch.float8_e8m0fnu)
    if fmt == "fp8":
        return formats.dequantize_fp8_rows(w.view(torch.float8_e4m3fn), s, dtype=torch.float32)
    return formats.dequantize_mxfp4(w, s, torch.float32)
