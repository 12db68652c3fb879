"""numba's njit as every compiled loop of the package uses it."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import TypeVar

import numba
import numpy as np
import torch

# The dtypes compiled loops take (numpy has no bfloat16: those tensors take the plain path).
COMPILED_DTYPES = (torch.float32, torch.float64)

T = TypeVar("T")


def compiled(fn=None, *, reassociate: bool = False, ieee_division: bool = False):
    """numba's njit (GIL released) with its on-disk cache where it can write one, which saves
    ~0.3 s per process; without it where it cannot (read-only install and home): numba
    refuses `cache=True` at decoration time there, which would make a module unimportable.

    `reassociate=True` (`@compiled(reassociate=True)`) lets LLVM reorder float sums and fuse
    multiply-adds, which vectorises a dot product: the result is within rounding of the loop as
    written, and still a function of the loop's own inputs only (the same row gives the same
    bits whatever else the call computes). `ieee_division=True` divides as numpy and torch do
    (x / 0 is inf or NaN) instead of checking for zero to raise as Python does: the check keeps
    a loop of divisions from vectorising; the quotients are the same IEEE ones.

    A compiled loop calls compiled code and reads constants of its own file only: the on-disk
    cache is checked against the file of the function it holds, so a change to a helper or a
    constant in another file would leave the cached caller running the old one."""
    if fn is None:
        return lambda f: compiled(f, reassociate=reassociate, ieee_division=ieee_division)
    flags = dict(nogil=True, boundscheck=False)
    if reassociate:
        flags["fastmath"] = {"reassoc", "contract"}
    if ieee_division:
        flags["error_model"] = "numpy"
    try:
        return numba.njit(cache=True, **flags)(fn)
    except RuntimeError:  # "cannot cache function ...: no locator available"
        return numba.njit(**flags)(fn)


def compiles(t: torch.Tensor) -> bool:
    """Whether the compiled loops take tensors of `t`'s dtype and device (`is_cpu`: a step asks
    ~100 times, and `t.device` builds an object each time, 4x the cost)."""
    return t.dtype in COMPILED_DTYPES and t.is_cpu


def numpy_of(t: torch.Tensor) -> np.ndarray:
    """The tensor's memory as a numpy array (no copy; parameters lose their autograd link).
    A step makes hundreds of these: the common case pays for `numpy()` alone."""
    try:
        return t.numpy()
    except RuntimeError:  # "Can't call numpy() on Tensor that requires grad"
        return t.detach().numpy()


# numpy's dtype of each torch dtype a compiled loop writes.
_NUMPY_DTYPES = {
    torch.float32: np.float32, torch.float64: np.float64, torch.int64: np.int64,
    torch.int32: np.int32, torch.uint8: np.uint8, torch.bool: np.bool_,
}  # fmt: skip


# Up to this many elements `host_empty` lets numpy allocate; larger ones come from torch.
HOST_ELEMENTS = 1 << 14


def host_empty(*shape: int, dtype: torch.dtype) -> tuple[torch.Tensor, np.ndarray]:
    """An uninitialised CPU tensor and its memory as a numpy array, for a compiled loop to fill.
    A small one numpy allocates and torch wraps (~1 us, where `torch.empty` and then `numpy()`
    cost ~3; a decode step makes ~100 of these: ~1% of the tiny size's step); a large one
    (a prefill's) torch allocates, 64-byte aligned for its GEMMs, where numpy's large blocks
    are 16-byte aligned."""
    if math.prod(shape) > HOST_ELEMENTS:
        tensor = torch.empty(shape, dtype=dtype)
        return tensor, tensor.numpy()
    array = np.empty(shape, _NUMPY_DTYPES[dtype])
    return torch.from_numpy(array), array


def prepared(module: torch.nn.Module, name: str, build: Callable[[], T], *watch: torch.Tensor) -> T:
    """`build()`'s result kept on `module` (weights in the form a fast path wants), built again
    when a watched tensor was changed in place or given new storage."""
    found = module.__dict__.get(name)
    if found is None or found[0] != _state(watch):
        value = build()  # may re-point the watched tensors (moe.Stacked)
        found = module.__dict__[name] = (_state(watch), value)
    return found[1]


def _state(tensors: tuple[torch.Tensor, ...]) -> tuple:
    return tuple((t.data_ptr(), t._version) for t in tensors)
