"""Input checks shared by the format modules: one error type, messages that name what was wrong.

Importing it does not import torch: `sizes` uses it, and torch-free modules use `sizes`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from sglang_ds41.errors import Ds41Error

if TYPE_CHECKING:
    import torch


class FormatError(Ds41Error):
    """A tensor handed to a quantisation format has the wrong shape or dtype."""


def require_float(x: torch.Tensor, what: str) -> None:
    if not x.is_floating_point():
        raise FormatError(f"{what}: expected a floating-point tensor, got dtype {x.dtype}")
    if x.dim() == 0:
        raise FormatError(f"{what}: expected at least one dimension, got a 0-d tensor")


def require_multiple(n: int, block: int, what: str, dim: str = "last dim") -> None:
    if block <= 0:
        raise FormatError(f"{what}: block size must be positive, got {block}")
    if n % block:
        raise FormatError(f"{what}: {dim} {n} is not a multiple of {block}")


def require_shape(t: torch.Tensor, expected: tuple[int, ...], what: str) -> None:
    if tuple(t.shape) != tuple(expected):
        raise FormatError(f"{what}: expected shape {list(expected)}, got {list(t.shape)}")


def packed_bytes(t: torch.Tensor, what: str) -> torch.Tensor:
    """Packed E2M1 pairs as uint8: checkpoints store them as U8 or I8 (same bits)."""
    import torch

    if t.dtype == torch.uint8:
        return t
    # torch spells the packed-FP4 dtype differently across versions; accept it when it exists.
    fp4_x2 = getattr(torch, "float4_e2m1fn_x2", None)
    if t.dtype == torch.int8 or (fp4_x2 is not None and t.dtype == fp4_x2):
        return t.view(torch.uint8)
    raise FormatError(f"{what}: expected packed E2M1 codes as uint8/int8, got dtype {t.dtype}")
