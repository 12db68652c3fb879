"""GPU gather + dequant of packed Engram rows (Triton).

NOT YET RUN ON A GPU: written on a CPU-only machine. It is checked bit-for-bit against the
torch path in Triton's CPU interpreter (`TRITON_INTERPRET=1`, see tests/engram/test_table.py),
and `test_gpu_kernel_agrees_with_torch_path` repeats that on real hardware wherever a GPU is
present; pinned-host tables are covered only by that GPU test. The bf16 rounding is done on
the bits (`_bf16_bits`), so the interpreter checks it too, subnormal results included.

Same contract as the torch path in `gather.py` — global row ids in, bf16 rows out, zero for
rows outside this rank's shard — but decoded arithmetically (no lookup table) and fused into
one kernel: each program reads one packed row (values + E8M0 scales, or NVFP4's E4M3 scales
times the table's float32 global scale, multiplied first as its decoders do) and writes its
`head_dim` bf16 values. The packed table may live in GPU memory or in pinned host memory
(read over the bus through unified addressing), which is how the host-resident table is
served without a copy. `EngramTable.lookup` uses this only for CUDA ids when Triton imports
and `SGLANG_DS41_ENGRAM_KERNEL` is not "0".
"""

from __future__ import annotations

import os

import torch

from sglang_ds41.engram.gather import Quant, TableFormat

try:
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - CPU-only installs
    triton = None


def available() -> bool:
    enabled = os.environ.get("SGLANG_DS41_ENGRAM_KERNEL") != "0"
    return enabled and triton is not None and torch.cuda.is_available()


if triton is not None:

    @triton.jit
    def _e8m0_to_f32(s):
        # 2**(s - 127) from its bits (s << 23); s = 0 is the subnormal 2**-127, s = 255 is NaN
        bits = tl.where(s == 0, 0x400000, s << 23)
        bits = tl.where(s == 255, 0x7FC00000, bits)
        return bits.to(tl.float32, bitcast=True)

    @triton.jit
    def _e2m1_to_f32(c):
        m = c & 7
        big = (1.0 + (m & 1).to(tl.float32) * 0.5) * tl.exp2(((m >> 1) - 1).to(tl.float32))
        mag = tl.where(m < 2, m.to(tl.float32) * 0.5, big)
        return tl.where((c & 8) != 0, -mag, mag)

    @triton.jit
    def _e4m3_to_f32(b):
        e = (b >> 3) & 15
        m = b & 7
        mag = tl.where(
            e == 0,
            m.to(tl.float32) * 0.001953125,  # subnormal: m * 2**-9
            (8 + m).to(tl.float32) * tl.exp2((e - 10).to(tl.float32)),
        )
        mag = tl.where((e == 15) & (m == 7), float("nan"), mag)
        return tl.where((b & 0x80) != 0, -mag, mag)

    @triton.jit
    def _bf16_bits(x):
        # float32 -> bf16 bits, round to nearest even, done on the bits: Triton's interpreter
        # truncates in `.to(tl.bfloat16)`, which NVFP4's many-bit products expose (the FP8 and
        # MXFP4 products fit bf16 exactly); quiet NaN stays NaN
        bits = x.to(tl.uint32, bitcast=True)
        rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16
        rounded = tl.where(x != x, 0x7FC0, rounded)
        return rounded.to(tl.uint16).to(tl.int16, bitcast=True)

    @triton.jit
    def _gather_kernel(
        table_ptr, ids_ptr, out_ptr, start, n_local, global_scale,
        ROW_BYTES: tl.constexpr, VALUE_BYTES: tl.constexpr, HEAD_DIM: tl.constexpr, QUANT: tl.constexpr,
        BLOCK: tl.constexpr,
    ):  # fmt: skip
        # QUANT: 0 = FP8 (E8M0 per 32 values), 1 = MXFP4 (E8M0 per 32), 2 = NVFP4 (E4M3 per 16)
        pid = tl.program_id(0)
        local = tl.load(ids_ptr + pid) - start
        owned = (local >= 0) & (local < n_local)
        row = table_ptr + tl.where(owned, local, 0) * ROW_BYTES
        offs = tl.arange(0, BLOCK)  # BLOCK = VALUE_BYTES rounded up to a power of two
        valid = offs < VALUE_BYTES
        b = tl.load(row + offs, mask=owned & valid, other=0).to(tl.int32)
        out_row = out_ptr + pid.to(tl.int64) * HEAD_DIM
        if QUANT == 2:
            s = tl.load(row + VALUE_BYTES + offs // 8, mask=owned & valid, other=0x38).to(tl.int32)
            scale = _e4m3_to_f32(s) * global_scale
            lo = _e2m1_to_f32(b & 15) * scale
            hi = _e2m1_to_f32(b >> 4) * scale
            tl.store(out_row + 2 * offs, _bf16_bits(lo), mask=valid)
            tl.store(out_row + 2 * offs + 1, _bf16_bits(hi), mask=valid)
        elif QUANT == 1:
            s = tl.load(row + VALUE_BYTES + offs // 16, mask=owned & valid, other=127).to(tl.int32)
            scale = _e8m0_to_f32(s)
            lo = _e2m1_to_f32(b & 15) * scale  # low nibble = even column
            hi = _e2m1_to_f32(b >> 4) * scale
            tl.store(out_row + 2 * offs, _bf16_bits(lo), mask=valid)
            tl.store(out_row + 2 * offs + 1, _bf16_bits(hi), mask=valid)
        else:
            s = tl.load(row + VALUE_BYTES + offs // 32, mask=owned & valid, other=127).to(tl.int32)
            tl.store(out_row + offs, _bf16_bits(_e4m3_to_f32(b) * _e8m0_to_f32(s)), mask=valid)


_QUANT_CODE = {Quant.FP8: 0, Quant.MXFP4: 1, Quant.NVFP4: 2}


def gather_dequantize_gpu(
    packed: torch.Tensor, global_ids: torch.Tensor, fmt: TableFormat, start: int, n_local: int
) -> torch.Tensor:
    """bf16 `[M, head_dim]` on `global_ids.device`; rows outside `[start, start + n_local)` are zero."""
    ids = global_ids.reshape(-1).to(torch.int64).contiguous()
    out = torch.empty((ids.numel(), fmt.head_dim), dtype=torch.bfloat16, device=ids.device)
    if ids.numel():
        _gather_kernel[(ids.numel(),)](
            packed, ids, out.view(torch.int16), start, n_local, float(fmt.global_scale or 0.0),
            ROW_BYTES=fmt.row_bytes, VALUE_BYTES=fmt.value_bytes, HEAD_DIM=fmt.head_dim,
            QUANT=_QUANT_CODE[fmt.quant], BLOCK=triton.next_power_of_2(fmt.value_bytes),
        )  # fmt: skip
    return out
