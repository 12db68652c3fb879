"""Gather + dequant of 4-bit Engram rows stored as two arrays, the layout upstream SGLang uses.

Upstream SGLang 0.5.23 keeps an Engram table as a value array and a scale array
(`EngramEmbedding.weight` / `.scale`), addressed by raw pointers so one kernel reads a device
table, a pinned host table or a scheduler-staged copy. The plugin (`sglang_ds41/plugin/`) keeps
that layout for MXFP4 so that everything upstream does with the two arrays (host tables,
scheduler staging, which copies raw bytes) works unchanged; only the decode differs:

    weight : uint8 [rows, dim / 2]   E2M1 codes, low nibble = even column
    scale  : E8M0  [rows, dim / 32]  one power of two per 32 values

`mxfp4_gather` has upstream's `engram_gather` signature (pointers, ids, out, `row_lo`/`row_hi`,
`sort_ids`). It builds each bf16 result from the code and scale bits with integer arithmetic
only: an E2M1 value times 2**(s - 127) is always exactly a bf16 (normal, subnormal for scale
bytes 0 and 1, or +-inf on overflow), so no float rounding is involved and the kernel is bit
for bit `formats.mxfp4.dequantize_mxfp4(...).to(bfloat16)`, in Triton's CPU interpreter as on a
GPU. Scale byte 255 (NaN) makes the whole block NaN with the bits 0xFFFF, the pattern torch's
float32 -> bf16 conversion gives every NaN on the CPU, so the two paths agree bit for bit.
Ids outside `[row_lo, row_hi)` give zero rows (the zero-fill that the TP all-reduce sums).

NVFP4 tables (`formats/nvfp4.py`) are the same two arrays with an E4M3 scale per 16 values
(`scale` uint8/E4M3 `[rows, dim/16]`) and one float32 global scale per table; a value is
`e2m1 * (e4m3 * global)` in float32, as `formats.dequantize_nvfp4` forms it, rounded to bf16
(to nearest even) on the float32 bits in integer arithmetic, so again interpreter and GPU agree
with the torch decode bit for bit (NaN scale bytes 0x7F / 0xFF: 0xFFFF, as above).
"""

from __future__ import annotations

import torch

from sglang_ds41.formats.engram import MXFP4, NVFP4

try:
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - CPU-only installs without triton
    triton = None

MX_BLOCK = MXFP4.scale_block  # values per E8M0 scale (32)
NV_BLOCK = NVFP4.scale_block  # values per E4M3 scale (16)


def mxfp4_rows(
    weight: torch.Tensor, scale: torch.Tensor, local: torch.Tensor, owned: torch.Tensor
) -> torch.Tensor:
    """The torch path: bf16 `[*local.shape, dim]` rows `local` of a split table, zero where not `owned`."""
    local = local.masked_fill(~owned, 0)
    values = MXFP4.dequantize(weight[local], scale[local])
    return values.masked_fill(~owned.unsqueeze(-1), 0)


def nvfp4_rows(
    weight: torch.Tensor, scale: torch.Tensor, global_scale: float, local: torch.Tensor, owned: torch.Tensor
) -> torch.Tensor:
    """The torch path for NVFP4: bf16 rows `local` of a split table, zero where not `owned`."""
    local = local.masked_fill(~owned, 0)
    values = NVFP4.dequantize(weight[local], scale[local], global_scale)
    return values.masked_fill(~owned.unsqueeze(-1), 0)


if triton is not None:

    @triton.jit
    def _e2m1_times_e8m0_bf16_bits(code, exp):
        """bf16 bit pattern (int32, 0..0xFFFF) of e2m1(code) * 2**(exp - 127), exactly."""
        m = code & 7
        # magnitudes 0.5, 1, 1.5, 2, 3, 4, 6 = (1 + frac / 2) * 2**k
        k = tl.where(m >= 2, (m >> 1) - 1, -1)
        frac = tl.where(m >= 2, m & 1, 0)
        biased = k + exp  # the result's bf16 exponent field, if normal
        normal = (biased << 7) | (frac << 6)
        # biased 0 / -1 (scale bytes 0 and 1 with small codes): subnormal, mantissa * 2**-133
        subnormal = (64 + 32 * frac) >> tl.where(biased < 0, -biased, 0)
        mag = tl.where(biased >= 255, 0x7F80, tl.where(biased >= 1, normal, subnormal))
        mag = tl.where(m == 0, 0, mag)
        bits = ((code & 8) << 12) | mag
        return tl.where(exp == 255, 0xFFFF, bits)

    @triton.jit
    def _e2m1_f32(code):
        m = code & 7
        k = tl.where(m >= 2, (m >> 1) - 1, -1)
        frac = tl.where(m >= 2, m & 1, 0)
        bits = tl.where(m == 0, 0, ((k + 127) << 23) | (frac << 22)) | ((code & 8) << 28)
        return bits.to(tl.float32, bitcast=True)

    @triton.jit
    def _e4m3_f32(byte):
        """An E4M3 (float8_e4m3fn) byte as float32, from its bits (no exp2); 0x7F / 0xFF NaN."""
        e = (byte >> 3) & 15
        m = byte & 7
        normal = (((e + 120) << 23) | (m << 20)).to(tl.float32, bitcast=True)
        mag = tl.where(e == 0, m.to(tl.float32) * 0.001953125, normal)  # subnormal: m * 2**-9, exact
        mag = tl.where((byte & 0x80) != 0, -mag, mag)
        return tl.where((e == 15) & (m == 7), float("nan"), mag)

    @triton.jit
    def _f32_to_bf16_bits(x):
        """float32 -> bf16 bit pattern (int32, 0..0xFFFF), round to nearest even; NaN 0xFFFF."""
        bits = x.to(tl.int32, bitcast=True)
        lower = bits & 0xFFFF
        upper = (bits >> 16) & 0xFFFF
        round_up = (lower > 0x8000) | ((lower == 0x8000) & ((upper & 1) == 1))
        rounded = upper + round_up.to(tl.int32)  # carries into the exponent correctly (to inf)
        return tl.where(x != x, 0xFFFF, rounded)

    @triton.jit
    def _fp4_gather_kernel(
        w_ptr, s_ptr, ids_ptr, dst_ptr, out_ptr, row_lo, row_hi, global_scale,
        DIM: tl.constexpr, BLOCK: tl.constexpr, NVFP4: tl.constexpr, HAS_DST: tl.constexpr,
    ):  # fmt: skip
        """One program per id: its row's DIM / 2 code bytes and DIM / BLOCK scale bytes -> DIM bf16."""
        row = tl.program_id(0).to(tl.int64)
        idx = tl.load(ids_ptr + row).to(tl.int64)
        dst = tl.load(dst_ptr + row).to(tl.int64) if HAS_DST else row
        owned = (idx >= row_lo) & (idx < row_hi)
        local = tl.where(owned, idx - row_lo, 0)
        w = w_ptr.to(tl.int64).to(tl.pointer_type(tl.uint8))
        s = s_ptr.to(tl.int64).to(tl.pointer_type(tl.uint8))
        offs = tl.arange(0, DIM // 2)  # one byte = columns 2i (low nibble) and 2i + 1
        b = tl.load(w + local * (DIM // 2) + offs, mask=owned, other=0).to(tl.int32)
        e = tl.load(s + local * (DIM // BLOCK) + offs // (BLOCK // 2), mask=owned, other=0).to(tl.int32)
        if NVFP4:
            block_scale = _e4m3_f32(e) * global_scale  # the two scales first, as the decoders do
            lo = _f32_to_bf16_bits(_e2m1_f32(b & 15) * block_scale)
            hi = _f32_to_bf16_bits(_e2m1_f32(b >> 4) * block_scale)
        else:
            lo = _e2m1_times_e8m0_bf16_bits(b & 15, e)
            hi = _e2m1_times_e8m0_bf16_bits(b >> 4, e)
        bits = tl.where(owned, tl.interleave(lo, hi), 0)
        bits = bits - ((bits >> 15) << 16)  # 0..0xFFFF -> the int16 with those bits
        tl.store(out_ptr + dst * DIM + tl.arange(0, DIM), bits.to(tl.int16))  # out viewed as int16


def _check(dim: int, ids: torch.Tensor, out: torch.Tensor, block: int, name: str) -> None:
    if triton is None:
        raise RuntimeError(f"{name} needs triton; use the torch path (mxfp4_rows / nvfp4_rows) on the CPU")
    if dim <= 0 or dim & (dim - 1) or dim % block:
        raise ValueError(f"{name}: dim must be a power of two and a multiple of {block}, got {dim}")
    if ids.dtype not in (torch.int32, torch.int64) or not ids.is_contiguous() or ids.dim() != 1:
        raise ValueError(f"{name}: ids must be contiguous 1-d int32/int64, got {ids.dtype} {list(ids.shape)}")
    if out.dtype != torch.bfloat16 or not out.is_contiguous() or tuple(out.shape) != (ids.numel(), dim):
        raise ValueError(
            f"{name}: out must be contiguous bf16 [{ids.numel()}, {dim}], got {out.dtype} {list(out.shape)}"
        )


def mxfp4_gather(
    weight_ptr: int,
    scale_ptr: int,
    ids: torch.Tensor,
    out: torch.Tensor,
    dim: int,
    row_lo: int = 0,
    row_hi: int = 2**62,
    sort_ids: bool = False,
) -> torch.Tensor:
    """Gather global rows `ids` ([N] int) into `out` ([N, dim] bf16, contiguous, on the ids' device).

    `weight_ptr` addresses [rows, dim / 2] E2M1 bytes and `scale_ptr` [rows, dim / 32] E8M0
    bytes of global rows [row_lo, row_hi), in device or pinned/registered host memory.
    `sort_ids` reads rows in address order and writes each to its place (upstream's remedy for
    random reads of a host table larger than the GPU's translation reach).
    """
    _check(dim, ids, out, MX_BLOCK, "mxfp4_gather")
    return _launch(weight_ptr, scale_ptr, ids, out, dim, row_lo, row_hi, sort_ids, 0.0, MX_BLOCK)


def nvfp4_gather(
    weight_ptr: int,
    scale_ptr: int,
    ids: torch.Tensor,
    out: torch.Tensor,
    dim: int,
    global_scale: float,
    row_lo: int = 0,
    row_hi: int = 2**62,
    sort_ids: bool = False,
) -> torch.Tensor:
    """`mxfp4_gather` for NVFP4 rows: `scale_ptr` addresses [rows, dim / 16] E4M3 bytes and
    `global_scale` is the table's float32 `weight_scale_2`."""
    _check(dim, ids, out, NV_BLOCK, "nvfp4_gather")
    return _launch(weight_ptr, scale_ptr, ids, out, dim, row_lo, row_hi, sort_ids, global_scale, NV_BLOCK)


def _launch(
    weight_ptr: int, scale_ptr: int, ids: torch.Tensor, out: torch.Tensor, dim: int,
    row_lo: int, row_hi: int, sort_ids: bool, global_scale: float, block: int,
) -> torch.Tensor:  # fmt: skip
    if ids.numel():
        ids, dst = torch.sort(ids) if sort_ids else (ids, None)
        _fp4_gather_kernel[(ids.numel(),)](
            weight_ptr, scale_ptr, ids, dst if dst is not None else ids, out.view(torch.int16),
            row_lo, row_hi, float(global_scale),
            DIM=dim, BLOCK=block, NVFP4=block == NV_BLOCK, HAS_DST=dst is not None,
        )  # fmt: skip
    return out
