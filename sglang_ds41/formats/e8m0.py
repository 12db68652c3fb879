"""E8M0 (UE8M0) power-of-two scales: one byte b means 2**(b - 127); b = 255 is NaN.

safetensors loads F8_E8M0 tensors as ``torch.float8_e8m0fnu``; a raw ``uint8`` view of the same
bytes is accepted everywhere too. Decoding builds float32 bit patterns directly, so it is exact
on any device (byte 0 is the float32 subnormal 2**-127) and never depends on a libm ``exp2``.
"""

from __future__ import annotations

import torch

from .checks import FormatError

BIAS = 127
NAN_BYTE = 255
MIN_EXPONENT = -127
MAX_EXPONENT = 127


def as_bytes(scales: torch.Tensor, what: str = "e8m0 scales") -> torch.Tensor:
    """The raw scale bytes (uint8 view) of a float8_e8m0fnu or uint8 tensor."""
    if scales.dtype == torch.float8_e8m0fnu:
        return scales.view(torch.uint8)
    if scales.dtype == torch.uint8:
        return scales
    raise FormatError(f"{what}: expected dtype float8_e8m0fnu or uint8, got {scales.dtype}")


def _bytes_to_float32(biased: torch.Tensor) -> torch.Tensor:
    # float32 also has an 8-bit exponent with bias 127, so for 1..254 the byte *is* the exponent
    # field; 0 needs the subnormal pattern for 2**-127 and 255 maps to a quiet NaN.
    bits = biased.to(torch.int32) << 23
    bits = torch.where(biased == 0, torch.full_like(bits, 1 << 22), bits)
    bits = torch.where(biased == NAN_BYTE, torch.full_like(bits, 0x7FC00000), bits)
    return bits.view(torch.float32)


def decode(scales: torch.Tensor) -> torch.Tensor:
    """Scale bytes -> float32 powers of two (exact)."""
    return _bytes_to_float32(as_bytes(scales))


def pow2(exponent: torch.Tensor) -> torch.Tensor:
    """2**exponent as float32 for integer exponents in [-127, 127] (exact)."""
    return _bytes_to_float32(exponent.to(torch.int32) + BIAS)


def encode(exponent: torch.Tensor, invalid: torch.Tensor | None = None) -> torch.Tensor:
    """Integer exponents -> float8_e8m0fnu bytes, clamped to [-127, 127]; ``invalid`` -> NaN byte."""
    biased = exponent.to(torch.int32).clamp(MIN_EXPONENT, MAX_EXPONENT) + BIAS
    if invalid is not None:
        biased = torch.where(invalid, torch.full_like(biased, NAN_BYTE), biased)
    return biased.to(torch.uint8).view(torch.float8_e8m0fnu)


def floor_log2(x: torch.Tensor) -> torch.Tensor:
    """floor(log2(x)) for positive finite float32, exact (frexp, not a rounded log2)."""
    _, e = torch.frexp(x)
    return e - 1


def ceil_log2(x: torch.Tensor) -> torch.Tensor:
    """ceil(log2(x)) for positive finite float32, exact."""
    m, e = torch.frexp(x)
    return torch.where(m == 0.5, e - 1, e)


def ceil_scale_exponent(amax: torch.Tensor, qmax: float, amax_floor: float = 0.0) -> torch.Tensor:
    """Smallest e with amax / 2**e <= qmax, as ``ceil(log2(max(amax, floor) / qmax))``.

    The ratio is formed in float32 like the reference kernels. A zero ratio (all-zero block and no
    floor) gets the smallest scale, 2**-127; the codes are then all zero whatever the scale.
    """
    ratio = torch.clamp(amax.float(), min=amax_floor) / qmax
    positive = ratio > 0
    exp = ceil_log2(torch.where(positive, ratio, torch.ones_like(ratio)))
    exp = torch.where(positive, exp, torch.full_like(exp, MIN_EXPONENT))
    return exp.clamp(MIN_EXPONENT, MAX_EXPONENT)
