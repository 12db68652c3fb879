"""The KV fake-quantisers (`formats.kv_quant`, MODEL.md §4.2, §4.4, §4.5) as compiled loops that
give the stored bytes and the dequantised rows of a quantisation at once.

    window_fp8(x)  -> (fake, packed)   FP8 E4M3 / 32, UE8M0 scales     (window KV)
    latent_fp4(x)  -> (fake, packed)   E2M1 / 16, E4M3 scales          (compressed latents)
    index_fp4(x)   -> (fake, packed)   E2M1 / 32, UE8M0 scales         (index keys, queries)
    decode(packed, kind, dtype)        the rows a packed store holds

`packed` rows are `backend.kv_codec`'s layout (codes, then scale bytes) and equal the oracle's
bytes bit for bit, as do the dequantised rows: every step is the oracle's float32 arithmetic
(a power-of-two scale, a float32 division, round-to-nearest-even to E4M3, E2M1's tie table).
A row with a non-finite value takes the oracle (its NaN scale rules are the definition's).
"""

from __future__ import annotations

import math

import numpy as np
import torch

from sglang_ds41.formats import e2m1, e8m0, kv_quant
from sglang_ds41.formats.fp8 import E4M3_MAX, dequantize_fp8_rows
from sglang_ds41.formats.mxfp4 import dequantize_mxfp4

from .jit import compiled, compiles, host_empty, numpy_of

# Decode tables: every E4M3 byte, every UE8M0 byte, every E2M1 code, as float32.
_E4M3 = torch.arange(256, dtype=torch.uint8).view(torch.float8_e4m3fn).float().numpy()
_E8M0 = e8m0.decode(torch.arange(256, dtype=torch.uint8)).numpy()
_E2M1 = np.array(e2m1.VALUES, dtype=np.float32)
_TIES_DOWN = np.array(e2m1.TIES_DOWN, dtype=np.float32)  # the encoder's tie rule
_TIES_UP = np.array(e2m1.TIES_UP, dtype=np.float32)

WINDOW, LATENT, INDEX = "window", "latent", "index"


@compiled
def _e2m1_code(v, ties_down, ties_up):
    """float32 v (already scaled) -> its E2M1 code, as `e2m1.encode` (sign bit iff v < 0)."""
    a = abs(v)
    index = 0
    for t in ties_down:
        if t < a:
            index += 1
    for t in ties_up:
        if t <= a:
            index += 1
    return index | (8 if v < 0 else 0)


@compiled
def _ceil_exponent(amax, qmax, floor):
    """`e8m0.ceil_scale_exponent` of one block: float32 ratio, exact ceil(log2)."""
    ratio = np.float32(max(amax, floor)) / np.float32(qmax)
    if not ratio > 0:
        return -127
    f, k = math.frexp(np.float64(ratio))
    e = k - 1 if f == 0.5 else k
    return min(max(e, -127), 127)


@compiled
def _block_amax(x, r, lo, hi):
    """max |x[r, lo:hi]| in float32, or -1 when a value is not finite (the oracle's NaN rules decide)."""
    amax = np.float32(0.0)
    for i in range(lo, hi):
        v = np.float32(x[r, i])
        if not np.isfinite(v):
            return np.float32(-1.0)
        amax = max(amax, abs(v))
    return amax


@compiled
def _e4m3_code(u, v):
    """float32 v with |v| <= 448 (u: its bits) -> its E4M3 byte, round to nearest even, the
    sign kept on zero: a normal value rounds its mantissa to 3 bits in the integer bits (a
    carry moves into the exponent), then rebiases the exponent from 127 to 7; an E4M3
    subnormal (|v| < 2**-6) is the nearest multiple of 2**-9, 8 rounding up into the first
    normal code."""
    sign = (u >> 31) << 7
    a = u & 0x7FFFFFFF
    if a < 0x3C800000:  # below 2**-6: multiples of 2**-9
        return sign | int(np.rint(abs(np.float64(v)) * 512.0))
    return sign | (((a + 0x7FFFF + ((a >> 20) & 1)) >> 20) - ((127 - 7) << 3))


@compiled
def _window_fp8(x, block, floor, e4m3, e8m0_, fake, packed):
    rows, dim = x.shape
    scaled = np.empty(block, np.float32)
    bits = scaled.view(np.uint32)
    for r in range(rows):
        for b in range(dim // block):
            amax = _block_amax(x, r, b * block, (b + 1) * block)
            if amax < 0:
                return False
            exp = _ceil_exponent(amax, 448.0, floor)
            packed[r, dim + b] = exp + 127
            inv = np.float32(2.0**-exp)
            scale = e8m0_[exp + 127]
            for j in range(block):
                v = np.float32(x[r, b * block + j]) * inv
                scaled[j] = min(max(v, np.float32(-448.0)), np.float32(448.0))
            for j in range(block):
                code = _e4m3_code(bits[j], scaled[j])
                packed[r, b * block + j] = code
                fake[r, b * block + j] = e4m3[code] * scale
    return True


@compiled
def _fp4(x, block, e4m3_scales, bound, e4m3, e8m0_, e2m1_, ties_down, ties_up, fake, packed):
    """E2M1 blocks with E4M3 scales clamp(amax / 6, bound, 448) (latents: values divided by the
    scale) or power-of-two scales from max(amax, bound) (index keys: values times 2**-e)."""
    rows, dim = x.shape
    half = dim // 2
    scale_value = np.empty(1, np.float32)  # an E4M3 scale, its bits for the encoder
    scale_bits = scale_value.view(np.uint32)
    for r in range(rows):
        for b in range(dim // block):
            amax = _block_amax(x, r, b * block, (b + 1) * block)
            if amax < 0:
                return False
            if e4m3_scales:
                scale_value[0] = min(max(amax / np.float32(6.0), np.float32(bound)), np.float32(448.0))
                code = _e4m3_code(scale_bits[0], scale_value[0])
                packed[r, half + b] = code
                scale = e4m3[code]
                divide, inv = True, np.float32(1.0)
            else:
                exp = _ceil_exponent(amax, 6.0, bound)
                packed[r, half + b] = exp + 127
                scale = e8m0_[exp + 127]
                divide, inv = False, np.float32(2.0**-exp)
            for i in range(b * block, (b + 1) * block, 2):
                a, c = np.float32(x[r, i]), np.float32(x[r, i + 1])
                if divide:
                    a, c = a / scale, c / scale
                else:
                    a, c = a * inv, c * inv
                lo, hi = _e2m1_code(a, ties_down, ties_up), _e2m1_code(c, ties_down, ties_up)
                packed[r, i // 2] = lo | (hi << 4)
                fake[r, i] = e2m1_[lo] * scale
                fake[r, i + 1] = e2m1_[hi] * scale
    return True


def _quantize(kind: str, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    if not compiles(x):
        return _oracle(kind, x)
    rows = x.reshape(-1, x.shape[-1]).contiguous()
    dim = rows.shape[1]
    fake, out = host_empty(*rows.shape, dtype=rows.dtype)
    values = numpy_of(rows)
    if kind == WINDOW:
        packed, packed_ = host_empty(rows.shape[0], dim + dim // kv_quant.WINDOW_BLOCK, dtype=torch.uint8)
        floor = kv_quant.WINDOW_AMAX_FLOOR
        ok = _window_fp8(values, kv_quant.WINDOW_BLOCK, floor, _E4M3, _E8M0, out, packed_)
    else:
        latent = kind == LATENT
        block = kv_quant.LATENT_BLOCK if latent else kv_quant.INDEX_BLOCK
        bound = kv_quant.LATENT_SCALE_MIN if latent else kv_quant.INDEX_AMAX_FLOOR
        packed, packed_ = host_empty(rows.shape[0], dim // 2 + dim // block, dtype=torch.uint8)
        tables = (_E4M3, _E8M0, _E2M1, _TIES_DOWN, _TIES_UP)
        ok = _fp4(values, block, latent, bound, *tables, out, packed_)
    if not ok:
        return _oracle(kind, x)
    return fake.view(x.shape), packed.view(*x.shape[:-1], packed.shape[1])


def _oracle(kind: str, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    quantize, fake_quant = {
        WINDOW: (kv_quant.quantize_window_fp8, kv_quant.fake_quant_window_fp8),
        LATENT: (kv_quant.quantize_latent_fp4, kv_quant.fake_quant_latent_fp4),
        INDEX: (kv_quant.quantize_index_fp4, kv_quant.fake_quant_index_fp4),
    }[kind]
    codes, scales = quantize(x)
    packed = torch.cat([codes.contiguous().view(torch.uint8), scales.contiguous().view(torch.uint8)], dim=-1)
    return fake_quant(x), packed


def window_fp8(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """`fake_quant_window_fp8(x)` and the packed rows [..., D + D/32] (`quantize_window_fp8`)."""
    return _quantize(WINDOW, x)


def latent_fp4(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """`fake_quant_latent_fp4(x)` and the packed rows [..., D/2 + D/16] (`quantize_latent_fp4`)."""
    return _quantize(LATENT, x)


def index_fp4(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """`fake_quant_index_fp4(x)` and the packed rows [..., D/2 + D/32] (`quantize_index_fp4`)."""
    return _quantize(INDEX, x)


QUANTIZERS = {WINDOW: window_fp8, LATENT: latent_fp4, INDEX: index_fp4}


# The decode loops look a block's scale up once per block (1.7x faster than per value).


@compiled
def _decode_fp8(packed, block, e4m3, e8m0_, out):
    rows, dim = out.shape
    for r in range(rows):
        for b0 in range(0, dim, block):
            scale = e8m0_[packed[r, dim + b0 // block]]
            for i in range(b0, min(dim, b0 + block)):
                out[r, i] = e4m3[packed[r, i]] * scale


@compiled
def _decode_fp4(packed, block, scales, e2m1_, out):
    rows, dim = out.shape
    half, pairs = dim // 2, block // 2  # a byte holds two values: a block spans block / 2 bytes
    for r in range(rows):
        for b0 in range(0, half, pairs):
            scale = scales[packed[r, half + 2 * b0 // block]]
            for i in range(b0, min(half, b0 + pairs)):
                byte = packed[r, i]
                out[r, 2 * i] = e2m1_[byte & 15] * scale
                out[r, 2 * i + 1] = e2m1_[byte >> 4] * scale


def decode(packed: torch.Tensor, kind: str, dim: int, dtype: torch.dtype) -> torch.Tensor:
    """Packed rows [N, bytes] of `kind` -> [N, dim] in `dtype` (the codec's decode)."""
    if dtype not in (torch.float32, torch.float64):
        return _oracle_decode(packed, kind, dim, dtype)
    out, out_ = host_empty(packed.shape[0], dim, dtype=dtype)
    rows = numpy_of(packed.contiguous())
    if kind == WINDOW:
        _decode_fp8(rows, kv_quant.WINDOW_BLOCK, _E4M3, _E8M0, out_)
    else:
        block, scales = (kv_quant.LATENT_BLOCK, _E4M3) if kind == LATENT else (kv_quant.INDEX_BLOCK, _E8M0)
        _decode_fp4(rows, block, scales, _E2M1, out_)
    return out


def _oracle_decode(packed: torch.Tensor, kind: str, dim: int, dtype: torch.dtype) -> torch.Tensor:
    if kind == WINDOW:
        codes, scales = packed[:, :dim].view(torch.float8_e4m3fn), packed[:, dim:]
        return dequantize_fp8_rows(codes, scales, kv_quant.WINDOW_BLOCK, dtype=dtype)
    codes, scales = packed[:, : dim // 2], packed[:, dim // 2 :]
    if kind == LATENT:
        return kv_quant.dequantize_latent_fp4(codes, scales.view(torch.float8_e4m3fn), dtype=dtype)
    return dequantize_mxfp4(codes, scales, dtype=dtype)


assert E4M3_MAX == 448.0  # the loops above spell it out
