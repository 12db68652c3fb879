"""Independent per-value implementations of the 4-bit formats, for tests: plain Python floats
(IEEE double) and numpy float32 scalars, written from the format definitions (MODEL.md §8.2,
§8.3; OCP MX v1.0; ModelOpt's NVFP4 rules) without calling `sglang_ds41.formats`."""

from __future__ import annotations

import math
import struct

import numpy as np

E2M1_GRID = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)


def e2m1_code(v: float) -> int:
    """Nearest E2M1 magnitude index (ties to the even index), saturating at 6; sign bit if v < 0."""
    m = min(abs(v), 6.0)
    best = min(range(8), key=lambda i: (abs(m - E2M1_GRID[i]), i % 2))
    return best | (8 if v < 0 else 0)


def e2m1_value(code: int) -> float:
    return -E2M1_GRID[code & 7] if code & 8 else E2M1_GRID[code & 7]


def e4m3_value(byte: int) -> float:
    """OCP E4M3 (fn): bias 7, 3 mantissa bits, subnormals, 0x7F / 0xFF NaN."""
    sign = -1.0 if byte & 0x80 else 1.0
    e, m = (byte >> 3) & 15, byte & 7
    if e == 15 and m == 7:
        return math.nan
    return sign * (m * 2.0**-9 if e == 0 else (1 + m / 8) * 2.0 ** (e - 7))


def e4m3_byte(v: float) -> int:
    """Positive v -> the nearest E4M3 byte (ties to even mantissa), saturating at 448 (0x7E)."""
    if v >= 448:
        return 0x7E
    return min(range(0x7F), key=lambda b: (abs(v - e4m3_value(b)), b % 2))


def f32(x: float) -> float:
    """Round a Python float to float32 (RNE)."""
    return struct.unpack("<f", struct.pack("<f", x))[0]


# --- MXFP4 ----------------------------------------------------------------------------------------


def ocp_exponent(block: list[float]) -> int:
    """OCP MX: floor(log2 amax) - 2, clamped to the E8M0 range (amax > 0)."""
    _, e = math.frexp(max(abs(v) for v in block))
    return max(-127, min(127, e - 1 - 2))


def mx_values(block: list[float], exponent: int) -> list[float]:
    s = 2.0**exponent
    return [e2m1_value(e2m1_code(v / s)) * s for v in block]


def squared_error(a: list[float], b: list[float]) -> float:
    total = 0.0
    for x, y in zip(a, b, strict=True):
        total += (x - y) ** 2
    return total


def mx_decode(packed: bytes, scale_bytes: bytes) -> list[float]:
    """A 32-value-block MXFP4 decoder: low nibble = even column, 2**(scale - 127)."""
    out = []
    for i, byte in enumerate(packed):
        s = 2.0 ** (scale_bytes[(2 * i) // 32] - 127)
        out += [e2m1_value(byte & 15) * s, e2m1_value(byte >> 4) * s]
    return out


# --- NVFP4 ----------------------------------------------------------------------------------------


def nv_block(block: list[float], ws2: float, rule: str) -> tuple[int, list[int]]:
    """(E4M3 scale byte, E2M1 codes) of one 16-value block under float32 global scale `ws2`.

    ModelOpt: scale = e4m3(amax / (6 * ws2)) (1.0 for a zero block), codes = e2m1(x / (scale * ws2))
    in float32. mse: of that byte and its neighbours (+1, then -1) the least squared error,
    summed column by column in float64, ties keeping the first."""
    f = np.float32
    amax = max(abs(v) for v in block)
    first = 0x38 if amax == 0 else e4m3_byte(float(f(amax) / (f(6.0) * f(ws2))))

    def codes_and_error(byte: int) -> tuple[list[int], float]:
        d = f(e4m3_value(byte)) * f(ws2)
        codes = [e2m1_code(float(f(v) / d)) if d > 0 else 0 for v in block]
        return codes, squared_error([e2m1_value(c) * float(d) for c in codes], block)

    best, (best_codes, best_err) = first, codes_and_error(first)
    if rule == "mse":
        for byte in (min(first + 1, 0x7E), max(first - 1, 0)):
            codes, err = codes_and_error(byte)
            if err < best_err:
                best, best_codes, best_err = byte, codes, err
    return best, best_codes


def nv_dequant(scale_byte: int, codes: list[int], ws2: float) -> list[float]:
    """ModelOpt's decode: e2m1 * (float32(scale) * ws2), in float32."""
    f = np.float32
    d = f(e4m3_value(scale_byte)) * f(ws2)
    return [float(f(e2m1_value(c)) * d) for c in codes]
