"""Re-encode Engram table rows between FP8 and MXFP4, on raw bytes (MODEL.md §8.4).

`formats.fp8_rows_to_mxfp4` is the definition, but it expands every value to float32 and runs
~25 MB/s on one core: 2 hours for the official 202 GB of tables. The same arithmetic collapses
to table look-ups, because within one 32-block every step is decided by two bytes:

* the block's MXFP4 exponent is ``s - 127 + floor(log2 max|v|) - 2`` (``s`` the FP8 scale byte),
  and E4M3 magnitudes order like their byte values, so ``max|v|`` is a max over bytes;
* each value is then ``fp8(byte) * 2**k`` with ``k = 2 - floor(log2 max|v|)`` in [-6, 11], so
  its E2M1 code is ``LUT[k][byte]`` -- and a little-endian uint16 holds two neighbouring bytes,
  so one look-up in ``PAIR[k][pair]`` yields the packed byte (low nibble = even column).

The tables are built by calling `formats.e2m1.encode` on exact float32 values, and rows holding a
block where the shortcut's premises fail (NaN values or scale, scale exponents that would clamp
or overflow float32) go through `formats.fp8_rows_to_mxfp4` itself, so the result is the
definition's bit for bit (tests compare exhaustively). The reverse direction, for tests, is
lossless and rare, so it simply calls the definitions.
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from functools import cache

import numpy as np
import torch

from sglang_ds41 import formats
from sglang_ds41.formats import e2m1

BLOCK = 32
_K_MIN, _K_MAX = -6, 11  # 2 - floor(log2 m) over E4M3 magnitudes m in [2**-9, 448]
_NAN_MAG = 0x7F  # E4M3fn NaN magnitude byte (0x7F / 0xFF)
_NAN_SCALE = 255
# Scale bytes from here on can overflow float32 when dequantised (448 * 2**120 > float32 max).
_OVERFLOW_SCALE = 247


@cache
def _tables() -> tuple[np.ndarray, np.ndarray]:
    """(floor(log2 |v|) per E4M3 byte as int16, packed-pair LUT uint8 [n_k * 65536])."""
    values = torch.arange(256, dtype=torch.uint8).view(torch.float8_e4m3fn).float()
    _, exponent = torch.frexp(values.abs())
    floor_log2 = (exponent - 1).numpy().astype(np.int16)  # byte 0: -1, never used (zero block)
    single = np.stack([e2m1.encode(values * 2.0**k).numpy() for k in range(_K_MIN, _K_MAX + 1)])
    pair = np.arange(65536)
    packed = single[:, pair & 0xFF] | (single[:, pair >> 8] << 4)
    return floor_log2, packed.astype(np.uint8).reshape(-1)


def fp8_to_mxfp4(weight: np.ndarray, scale: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """FP8 rows (uint8 [R, W] E4M3 bytes, uint8 [R, W/32] E8M0) -> MXFP4 (uint8 [R, W/2], [R, W/32]).

    Bit-identical to ``formats.fp8_rows_to_mxfp4``."""
    rows, width = weight.shape
    n_blocks = width // BLOCK
    floor_log2, pair_lut = _tables()
    blocks = weight.reshape(rows, n_blocks, BLOCK)
    max_mag = np.bitwise_and(blocks, 0x7F).max(axis=2)
    fl = floor_log2[max_mag]
    new_scale = scale.astype(np.int16) + fl - 2
    zero = max_mag == 0
    new_scale[zero] = 0  # the definition's all-zero block: scale byte 0, codes 0
    slow = (
        (max_mag == _NAN_MAG) | (scale >= _OVERFLOW_SCALE) | (~zero & ((new_scale < 0) | (new_scale > 254)))
    ).any(axis=1)
    k = np.where(zero, 0, 2 - fl) - _K_MIN
    index = (k.astype(np.uint32) << 16)[:, :, None] | weight.view("<u2").reshape(rows, n_blocks, BLOCK // 2)
    codes = pair_lut[index].reshape(rows, width // 2)
    scales = new_scale.astype(np.uint8)
    if slow.any():
        idx = np.flatnonzero(slow)
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


# Rows per worker below which threads cost more than they save.
_MIN_ROWS_PER_WORKER = 4096


@cache
def _pool(workers: int) -> ThreadPoolExecutor:
    return ThreadPoolExecutor(workers, thread_name_prefix="engram-recode")


def default_workers() -> int:
    return max(1, min(8, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else 1))


def recode(to: str, weight: np.ndarray, scale: np.ndarray, workers: int = 1) -> tuple[np.ndarray, np.ndarray]:
    """Rows of the other format -> rows of `to` (``mxfp4`` or ``fp8``).

    With `workers` > 1 the rows are split over threads: numpy's reductions and look-ups release
    the GIL, so FP8 -> MXFP4 scales with cores until the disk is the limit."""
    fn = fp8_to_mxfp4 if to == "mxfp4" else mxfp4_to_fp8
    n = min(workers, len(weight) // _MIN_ROWS_PER_WORKER)
    if n <= 1:
        return fn(weight, scale)
    bounds = np.linspace(0, len(weight), n + 1).astype(int)
    parts = list(
        _pool(n).map(
            lambda i: fn(weight[bounds[i] : bounds[i + 1]], scale[bounds[i] : bounds[i + 1]]), range(n)
        )
    )
    return np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts])


def decode(fmt: str, weight: np.ndarray, scale: np.ndarray) -> torch.Tensor:
    """Stored rows -> float32 values (for verification)."""
    w, s = torch.from_numpy(weight), torch.from_numpy(scale).view(torch.float8_e8m0fnu)
    if fmt == "fp8":
        return formats.dequantize_fp8_rows(w.view(torch.float8_e4m3fn), s, dtype=torch.float32)
    return formats.dequantize_mxfp4(w, s, torch.float32)
