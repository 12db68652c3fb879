"""Re-encode Engram table rows FP8 -> MXFP4 / NVFP4 (or MXFP4 -> FP8), on raw bytes (MODEL.md §8.4).

`formats.fp8_rows_to_mxfp4` / `fp8_rows_to_nvfp4` are the definitions, but they expand every
value to float32 and run ~25 MB/s on one core: 2 hours for the official 202 GB of tables. The
same arithmetic collapses to table look-ups, because within one FP8 32-block every MXFP4 step is
decided by a few bytes:

* the block's OCP exponent is ``s - 127 + floor(log2 max|v|) - 2`` (``s`` the FP8 scale byte),
  and E4M3 magnitudes order like their byte values, so ``max|v|`` is a max over bytes;
* each value is then ``fp8(byte) * 2**k`` with ``k = 2 - floor(log2 max|v|)`` in [-6, 11], so
  its E2M1 code is ``CODE[k][byte]`` and its squared error (in units of the FP8 scale) is
  ``ERR[k][byte]``: the ``mse`` rule sums 32 look-ups per candidate exponent (k, k - 1, k + 1)
  instead of re-rounding floats. The errors are integers in units of 2**-26 (every E4M3 and
  every candidate E2M1 value is a multiple of 2**-13 there), so the sums are exact and match
  the definition's float64 sums, which are exact on these values too.

NVFP4's divisor ``e4m3(scale) * weight_scale_2`` is an arbitrary float32, so its loop computes
per block: the definition's float32 divisor, the E2M1 rounding bounds times it (exact float64
products standing in for the float32 divisions, see `_NV_BOUNDS`) and the float64 error sums in
the definition's order (IEEE arithmetic, no fast-math: the same bits). numpy could only run these
as separate passes with materialised index arrays (slower than a disk), so the loops are compiled
with numba (sglang pins it too): one pass per row, releasing the GIL so `recode` spreads rows
over threads.

The tables are built by calling `formats.e2m1.encode` on exact float32 values, and rows holding a
block where a shortcut's premises fail (NaN values or scales, scale exponents that would clamp
or overflow float32) go through the definition itself, so the result is the definition's bit for
bit (tests compare exhaustively). The reverse direction, for tests, is lossless and rare, so it
simply calls the definitions.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from functools import cache

import numpy as np
import torch

from sglang_ds41 import formats
from sglang_ds41.fast.jit import compiled
from sglang_ds41.formats import e2m1
from sglang_ds41.formats.engram import FP8, MXFP4, NVFP4, EngramFormat

BLOCK = MXFP4.scale_block  # FP8 / MXFP4 values per scale (32)
NV_BLOCK = NVFP4.scale_block  # NVFP4 values per scale (16)
# Scale rules per target; the first is the default (see README: least squared error, the same
# decoders, never worse per block than the standard rule).
SCALE_RULES = {MXFP4.name: ("mse", "ocp"), NVFP4.name: ("mse", "modelopt"), FP8.name: ("exact",)}
TARGETS = tuple(SCALE_RULES)  # mxfp4, nvfp4, fp8

_K_MIN, _K_MAX = -7, 12  # 2 - floor(log2 m) over E4M3 magnitudes m in [2**-9, 448], +-1 for mse
_ERR_UNIT = 2.0**13  # values in units of 2**-13 of the FP8 scale are integers (squares: 2**-26)
_NAN_MAG = 0x7F  # E4M3fn NaN magnitude byte (0x7F / 0xFF)
# Scale bytes from here on can overflow float32 when dequantised (448 * 2**120 > float32 max);
# 255 is the NaN scale.
_OVERFLOW_SCALE = 247


@cache
def _mx_tables() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """floor(log2 |v|) per E4M3 byte (int32 [256]); per (k - K_MIN, byte) the E2M1 code of
    v * 2**k (uint8 [20, 256]) and its squared error in units of 2**-26 of the FP8 scale (int64)."""
    values = torch.arange(256, dtype=torch.uint8).view(torch.float8_e4m3fn).float()
    _, exponent = torch.frexp(values.abs())
    floor_log2 = (exponent - 1).numpy().astype(np.int32)  # byte 0: -1, never used (zero block)
    ks = range(_K_MIN, _K_MAX + 1)
    codes = torch.stack([e2m1.encode(values * 2.0**k) for k in ks])
    got = torch.stack([e2m1.decode(codes[i]).double() * 2.0**-k for i, k in enumerate(ks)])
    diff = (got - values.double()) * _ERR_UNIT
    diff = torch.where(torch.isfinite(diff), diff, torch.zeros_like(diff))  # NaN bytes: fallback rows
    return floor_log2, codes.numpy().astype(np.uint8), (diff.to(torch.int64) ** 2).numpy()


@cache
def _nv_tables() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Signed float32 value of each E4M3 byte, float32 2**(b - 127) per E8M0 byte (0 for 255,
    whose rows are redone by the definition), signed float64 value of each E2M1 code."""
    fp8 = torch.arange(256, dtype=torch.uint8).view(torch.float8_e4m3fn).float().numpy()
    pow2 = formats.e8m0.decode(torch.arange(256, dtype=torch.uint8)).numpy().copy()
    pow2[255] = 0.0
    return fp8.astype(np.float32), pow2.astype(np.float32), np.array(e2m1.VALUES, np.float64)


# Rows per worker below which threads cost more than they save.
_MIN_ROWS_PER_WORKER = 4096


@compiled
def _fp8_rows_to_mxfp4(weight, scale, floor_log2, lut, sq_err, mse, codes, scales, fallback):
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
            k = 2 - exponent - _K_MIN
            flagged |= (top == _NAN_MAG) | (new_scale < 0) | (new_scale > 254)
            if mse:
                flagged |= (new_scale < 1) | (new_scale > 253)  # a neighbour would clamp
                best = np.int64(0)
                for i in range(first, first + BLOCK):
                    best += sq_err[k, weight[r, i]]
                chosen = k
                for step in (-1, 1):  # exponent +1 (k - 1), then -1 (k + 1): MSE_OFFSETS order
                    err = np.int64(0)
                    for i in range(first, first + BLOCK):
                        err += sq_err[k + step, weight[r, i]]
                    if err < best:
                        best, chosen = err, k + step
                new_scale += k - chosen
                k = chosen
            scales[r, b] = np.uint8(new_scale & 0xFF)
            for i in range(first, first + BLOCK, 2):  # low nibble = even column
                codes[r, i // 2] = lut[k, weight[r, i]] | (lut[k, weight[r, i + 1]] << 4)
        fallback[r] = flagged


@compiled
def _e4m3_byte(v):
    """float32 v >= 0 -> its E4M3fn byte, round to nearest even, saturating at 448 (0x7E)."""
    if v >= np.float32(448.0):
        return np.int32(0x7E)
    if v < np.float32(2.0**-6):  # subnormal: multiples of 2**-9 (n = 8 is 2**-6, byte 8)
        return np.int32(np.rint(v * np.float32(512.0)))
    exponent = np.int32(math.frexp(v)[1]) - 1  # floor(log2 v) in [-6, 8]
    n = np.int32(np.rint(math.ldexp(v, 3 - exponent)))  # 8..16: exact scaling, then RNE
    if n == 16:
        exponent, n = exponent + 1, np.int32(8)
    return ((exponent + 7) << 3) | (n - 8)


# `formats.e2m1.encode(x / d)` compares the float32 quotient with 0.25 (>), 0.75 (>=), 1.25 (>),
# 1.75 (>=), 2.5 (>), 3.5 (>=), 5 (>). Each of those is an even float32, so under round-to-
# nearest-even fl(x / d) > t exactly when x / d > t + ulp/2 and fl(x / d) >= t exactly when
# x / d >= t - ulp/2: comparisons of |x| with these bounds times d, exact in float64 (26 + 24
# significant bits), give the same codes without a division. The sign bit is fl(x / d) < 0,
# i.e. x < 0 and |x / d| above 2**-150 (below it the quotient rounds to -0).
_NV_BOUNDS = np.array(
    [0.25 + 2**-26, 0.75 - 2**-25, 1.25 + 2**-24, 1.75 - 2**-24, 2.5 + 2**-23, 3.5 - 2**-23, 5.0 + 2**-22]
)
_NV_ZERO_BOUND = 2.0**-150


@compiled
def _nv_block(x, scale_byte, ws2, fp8, e2m1_f64, out_codes, want_err):
    """E2M1 codes of 16 values (float64, exact float32 ones) under E4M3 scale byte `scale_byte`,
    and (if `want_err`) their float64 squared error summed in column order: as `formats.nvfp4`
    forms both."""
    denom = fp8[scale_byte] * ws2  # float32, as the definition's divisor
    d = np.float64(denom)
    if denom > 0:
        t0, t1, t2, t3 = _NV_BOUNDS[0] * d, _NV_BOUNDS[1] * d, _NV_BOUNDS[2] * d, _NV_BOUNDS[3] * d
        t4, t5, t6, tz = _NV_BOUNDS[4] * d, _NV_BOUNDS[5] * d, _NV_BOUNDS[6] * d, _NV_ZERO_BOUND * d
        for j in range(NV_BLOCK):
            m = abs(x[j])
            c = (
                np.int32(m > t0) + np.int32(m >= t1) + np.int32(m > t2) + np.int32(m >= t3)
                + np.int32(m > t4) + np.int32(m >= t5) + np.int32(m > t6)
            )  # fmt: skip
            out_codes[j] = c | (np.int32((x[j] < 0) & (m > tz)) << 3)
    else:
        out_codes[:] = 0
    err = 0.0
    if not want_err:
        return err
    for j in range(NV_BLOCK):
        diff = e2m1_f64[out_codes[j]] * d - x[j]
        err += diff * diff
    return err


@compiled
def _fp8_rows_to_nvfp4(weight, scale, fp8, pow2, e2m1_f64, ws2, mse, codes, scales, fallback):
    rows, width = weight.shape
    six_ws2 = np.float32(6.0) * ws2
    x = np.empty(NV_BLOCK, np.float64)
    best_codes = np.empty(NV_BLOCK, np.int32)
    trial = np.empty(NV_BLOCK, np.int32)
    for r in range(rows):
        flagged = False
        for b in range(width // NV_BLOCK):
            s = np.int32(scale[r, b // 2])  # two NVFP4 blocks per FP8 block
            flagged |= s >= _OVERFLOW_SCALE
            first = b * NV_BLOCK
            top = np.int32(0)
            for j in range(NV_BLOCK):
                byte = weight[r, first + j]
                top = max(top, np.int32(byte & 0x7F))
                x[j] = np.float64(fp8[byte] * pow2[s])  # float32 product, exact
            if top == _NAN_MAG:  # NaN values: the definition redoes this row
                flagged = True
                continue
            amax = fp8[top] * pow2[s]
            chosen = _e4m3_byte(amax / six_ws2) if amax != 0 else np.int32(0x38)  # 1.0 for zero blocks
            best = _nv_block(x, chosen, ws2, fp8, e2m1_f64, best_codes, mse)
            if mse:
                first_choice = chosen
                for step in (1, -1):  # MSE_OFFSETS order
                    candidate = min(max(first_choice + step, 0), 0x7E)
                    err = _nv_block(x, candidate, ws2, fp8, e2m1_f64, trial, True)
                    if err < best:
                        best, chosen = err, candidate
                        best_codes[:] = trial
            scales[r, b] = np.uint8(chosen)
            for j in range(0, NV_BLOCK, 2):
                codes[r, (first + j) // 2] = np.uint8(best_codes[j] | (best_codes[j + 1] << 4))
        fallback[r] = flagged


def split_rows(rows: int, workers: int, run) -> None:
    """run(row slice) over `workers` threads (the compiled loops release the GIL)."""
    bounds = np.linspace(0, rows, max(1, min(workers, rows // _MIN_ROWS_PER_WORKER)) + 1).astype(int)
    parts = [slice(bounds[i], bounds[i + 1]) for i in range(len(bounds) - 1)]
    if len(parts) == 1:
        run(parts[0])
    else:
        list(_pool(len(parts)).map(run, parts))


def _check_fp8_rows(weight: np.ndarray, scale: np.ndarray) -> None:
    rows, width = weight.shape
    if width % BLOCK or scale.shape != (rows, FP8.scale_bytes(width)):
        raise ValueError(
            f"FP8 rows {weight.shape} / scales {scale.shape}: expected [R, W] and [R, W/{BLOCK}]"
        )


def _fp8_tensors(weight: np.ndarray, scale: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
    """FP8 row bytes as the tensors the definitions take (E4M3 values, E8M0 scales)."""
    return (
        torch.from_numpy(weight).view(FP8.values.torch_dtype()),
        torch.from_numpy(scale).view(FP8.scales.torch_dtype()),
    )


def _fp8_to_fp4(
    fmt: EngramFormat,
    weight: np.ndarray,
    scale: np.ndarray,
    scale_rule: str,
    workers: int,
    kernel: Callable[..., None],
    reference: Callable[[torch.Tensor, torch.Tensor], tuple[torch.Tensor, ...]],
) -> tuple[np.ndarray, np.ndarray]:
    """FP8 rows -> `fmt`'s 4-bit rows: `kernel(weight, scale, codes, scales, fallback)` encodes a
    part of the rows in place and flags the rows it leaves to `reference(weight, scale)` (the
    format's own definition, -> codes, scales, ...)."""
    _check_fp8_rows(weight, scale)
    rules = SCALE_RULES[fmt.name]
    if scale_rule not in rules:
        raise ValueError(f"{fmt.name.upper()} scale rule {scale_rule!r}: expected one of {rules}")
    rows, width = weight.shape
    codes = np.empty((rows, fmt.value_bytes(width)), np.uint8)
    scales = np.empty((rows, fmt.scale_bytes(width)), np.uint8)
    fallback = np.empty(rows, np.bool_)

    def run(part: slice) -> None:
        kernel(weight[part], scale[part], codes[part], scales[part], fallback[part])

    split_rows(rows, workers, run)
    if fallback.any():
        idx = np.flatnonzero(fallback)
        ref_codes, ref_scales = reference(*_fp8_tensors(weight[idx], scale[idx]))[:2]
        codes[idx] = ref_codes.numpy()
        scales[idx] = ref_scales.view(torch.uint8).numpy()
    return codes, scales


def fp8_to_mxfp4(
    weight: np.ndarray, scale: np.ndarray, workers: int = 1, scale_rule: str = "mse"
) -> tuple[np.ndarray, np.ndarray]:
    """FP8 rows (uint8 [R, W] E4M3 bytes, uint8 [R, W/32] E8M0) -> MXFP4 (uint8 [R, W/2], [R, W/32]).

    Bit-identical to ``formats.fp8_rows_to_mxfp4(..., scale_rule=scale_rule)``."""
    tables, mse = _mx_tables(), scale_rule == "mse"

    def kernel(w, s, codes, scales, fallback) -> None:
        _fp8_rows_to_mxfp4(w, s, *tables, mse, codes, scales, fallback)

    def reference(w, s):
        return MXFP4.from_fp8_rows(w, s, scale_rule)

    return _fp8_to_fp4(MXFP4, weight, scale, scale_rule, workers, kernel, reference)


def fp8_to_nvfp4(
    weight: np.ndarray, scale: np.ndarray, global_scale: float, workers: int = 1, scale_rule: str = "mse"
) -> tuple[np.ndarray, np.ndarray]:
    """FP8 rows -> NVFP4 rows (uint8 [R, W/2] codes, uint8 [R, W/16] E4M3 scale bytes) under the
    table's float32 `global_scale` (`formats.nvfp4.fp8_rows_global_scale` of the whole table).

    Bit-identical to ``formats.fp8_rows_to_nvfp4(..., global_scale, scale_rule=scale_rule)``."""
    tables, ws2, mse = _nv_tables(), np.float32(global_scale), scale_rule == "mse"

    def kernel(w, s, codes, scales, fallback) -> None:
        _fp8_rows_to_nvfp4(w, s, *tables, ws2, mse, codes, scales, fallback)

    def reference(w, s):
        return NVFP4.from_fp8_rows(w, s, scale_rule, torch.tensor(ws2))

    return _fp8_to_fp4(NVFP4, weight, scale, scale_rule, workers, kernel, reference)


def mxfp4_to_fp8(codes: np.ndarray, scale: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """MXFP4 rows (uint8 [R, W/2], [R, W/32]) -> FP8 rows (uint8 [R, W], [R, W/32]).

    Lossless: E2M1 values have two significant bits and a block spans at most 12x, well inside
    E4M3's normal range once rescaled to amax in (224, 448]."""
    exact = MXFP4.dequantize(
        torch.from_numpy(codes), torch.from_numpy(scale).view(MXFP4.scales.torch_dtype()), dtype=torch.float32
    )
    values, scales = formats.quantize_fp8_rows(exact)
    return values.view(torch.uint8).numpy(), scales.view(torch.uint8).numpy()


@cache
def _pool(workers: int) -> ThreadPoolExecutor:
    return ThreadPoolExecutor(workers, thread_name_prefix="engram-recode")


def default_workers() -> int:
    return max(1, min(8, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else 1))


def default_scale_rule(to: str) -> str:
    return SCALE_RULES[to][0]


def recode(
    to: str,
    weight: np.ndarray,
    scale: np.ndarray,
    workers: int = 1,
    scale_rule: str | None = None,
    global_scale: float | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Rows of the source format -> (values, scales) of `to`: ``mxfp4`` / ``nvfp4`` from FP8
    (`workers` threads; NVFP4 needs the table's `global_scale`), ``fp8`` from MXFP4."""
    rule = scale_rule or default_scale_rule(to)
    if to == MXFP4.name:
        return fp8_to_mxfp4(weight, scale, workers, rule)
    if to == NVFP4.name:
        if global_scale is None:
            raise ValueError(f"NVFP4 rows need the table's global scale ({NVFP4.global_scale.name})")
        return fp8_to_nvfp4(weight, scale, global_scale, workers, rule)
    return mxfp4_to_fp8(weight, scale)
