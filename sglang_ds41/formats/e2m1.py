"""E2M1 (FP4) codes: the 16-entry table, round-to-nearest-even encoding, nibble packing.

A code is sign (bit 3) + magnitude index (bits 0-2) into {0, 0.5, 1, 1.5, 2, 3, 4, 6}. Two codes
share a byte with the **even column in the low nibble** (the order of the official checkpoints,
PyTorch's ``float4_e2m1fn_x2`` and ModelOpt).

Sign of zero: a negative input that rounds to zero encodes as -0 (code 8), but an input of -0.0
encodes as +0 (code 0), i.e. the sign bit is ``x < 0`` -- ModelOpt's rule, so NVFP4 bytes match
what ModelOpt writes. Hence ``encode(decode(8)) == 0``; both decode to zero.
"""

from __future__ import annotations

import torch

from .checks import FormatError, packed_bytes

MAX = 6.0
VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0)

# Midpoints between neighbouring magnitudes. A tie rounds to the neighbour with the even code
# (even mantissa bit): down where the lower code is even, up where it is odd.
TIES_DOWN = (0.25, 1.25, 2.5, 5.0)  # between codes 0|1, 2|3, 4|5, 6|7
TIES_UP = (0.75, 1.75, 3.5)  # between codes 1|2, 3|4, 5|6


def decode(codes: torch.Tensor) -> torch.Tensor:
    """Codes (any integer dtype, values 0..15) -> float32 values."""
    table = torch.tensor(VALUES, dtype=torch.float32, device=codes.device)
    return table[codes.long()]


# byte -> the values of its (low, high) nibbles, so packed bytes decode with one gather
_PAIRS = torch.tensor([(VALUES[b & 15], VALUES[b >> 4]) for b in range(256)], dtype=torch.float32)


def decode_packed(packed: torch.Tensor) -> torch.Tensor:
    """Bytes [..., K/2] (uint8/int8) -> float32 values [..., K]: ``decode(unpack(packed))`` in one
    table gather (the hot decode of the 4-bit weights, latents and index keys)."""
    b = _unpack_checked(packed)
    pairs = _PAIRS.to(b.device)[b.long()]  # [..., K/2, 2]
    return pairs.reshape(*b.shape[:-1], b.shape[-1] * 2)


def encode(x: torch.Tensor) -> torch.Tensor:
    """Float values (already divided by their scale) -> uint8 codes, RNE, saturating at +-6.

    NaN inputs give an unspecified code; block quantisers flag NaN through the scale instead.
    """
    xf = x.float()
    mag = xf.abs().contiguous()  # bucketize copies strided input anyway
    down = torch.tensor(TIES_DOWN, dtype=torch.float32, device=x.device)
    up = torch.tensor(TIES_UP, dtype=torch.float32, device=x.device)
    # bucketize(right=False) counts boundaries < mag; right=True counts boundaries <= mag.
    index = torch.bucketize(mag, down, out_int32=True) + torch.bucketize(mag, up, right=True, out_int32=True)
    sign = (xf < 0).to(torch.uint8) << 3
    return index.to(torch.uint8) | sign


def pack(codes: torch.Tensor) -> torch.Tensor:
    """Codes [..., K] -> bytes [..., K/2]; column 2i in the low nibble, 2i+1 in the high nibble."""
    if codes.dim() == 0 or codes.shape[-1] % 2:
        raise FormatError(f"e2m1 pack: last dim must be even, got shape {list(codes.shape)}")
    c = codes.to(torch.uint8)
    return (c[..., 0::2] & 0x0F) | ((c[..., 1::2] & 0x0F) << 4)


def unpack(packed: torch.Tensor) -> torch.Tensor:
    """Bytes [..., K/2] (uint8/int8) -> codes [..., K] as uint8."""
    b = _unpack_checked(packed)
    pairs = torch.stack((b & 0x0F, b >> 4), dim=-1)
    return pairs.reshape(*b.shape[:-1], b.shape[-1] * 2)


def _unpack_checked(packed: torch.Tensor) -> torch.Tensor:
    b = packed_bytes(packed, "e2m1 unpack")
    if b.dim() == 0:
        raise FormatError("e2m1 unpack: expected at least one dimension, got a 0-d tensor")
    return b
