"""The split-layout MXFP4 gather (the plugin's kernel) against the torch decode, bit for bit.

The Triton kernel runs in Triton's CPU interpreter (`TRITON_INTERPRET=1`, in a fresh
interpreter because the variable is read at import); on a GPU `scripts/gpu_check.sh` repeats
the comparison on the device. The torch side is `formats.mxfp4.dequantize_mxfp4`, which
tests/formats checks against hand-written blocks and the E2M1 / E8M0 definitions.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest
import torch

from sglang_ds41.engram.split_gather import mxfp4_rows
from sglang_ds41.formats.mxfp4 import dequantize_mxfp4

KERNEL_CHECK = textwrap.dedent(
    """
    import torch
    from sglang_ds41.engram.split_gather import mxfp4_gather, mxfp4_rows

    def every_pair_table(dim, scale_bytes):
        # every code byte under each scale byte (0, 1: subnormal results; 254: overflow; 255: NaN)
        n_bytes = dim // 2
        code_rows = torch.arange(256, dtype=torch.uint8).view(-1, n_bytes)  # [256 / n_bytes, n_bytes]
        weight = code_rows.repeat(len(scale_bytes), 1)
        scale = torch.tensor(scale_bytes, dtype=torch.uint8).repeat_interleave(code_rows.shape[0])
        scale = scale[:, None].expand(-1, dim // 32).contiguous()
        return weight, scale.view(torch.float8_e8m0fnu)

    failures = []
    cases = [
        (256, list(range(256)), 0, False),  # every (code byte, scale byte) pair
        (256, [0, 1, 2, 127, 253, 254, 255], 7, True),
        (32, [0, 1, 2, 126, 127, 128, 253, 254, 255], 0, True),
        (32, [0, 1, 127, 254, 255], 5, False),
    ]
    for dim, scale_bytes, row_lo, sort_ids in cases:
        weight, scale = every_pair_table(dim, scale_bytes)
        rows = weight.shape[0]
        row_hi = row_lo + rows
        gen = torch.Generator().manual_seed(dim + row_lo)
        some = torch.randint(row_lo - 5, row_hi + 5, (64,), generator=gen)
        ids = torch.cat([torch.arange(row_lo - 3, row_hi + 3), some])
        out = torch.full((ids.numel(), dim), 1.0, dtype=torch.bfloat16)
        mxfp4_gather(weight.data_ptr(), scale.data_ptr(), ids, out, dim, row_lo=row_lo, row_hi=row_hi,
                     sort_ids=sort_ids)
        local = ids - row_lo
        want = mxfp4_rows(weight, scale, local, (local >= 0) & (local < rows))
        if not torch.equal(out.view(torch.int16), want.view(torch.int16)):
            bad = (out.view(torch.int16) != want.view(torch.int16)).nonzero()[:3].tolist()
            failures.append((dim, row_lo, sort_ids, bad))
    # NVFP4: every code byte under every E4M3 scale byte (0x7F / 0xFF: NaN), global scales that
    # give ordinary, subnormal and overflowing products
    from sglang_ds41.engram.split_gather import nvfp4_gather, nvfp4_rows

    edge_bytes = [0, 1, 7, 8, 0x38, 0x39, 0x7E, 0x7F, 0x80, 0x81, 0xB8, 0xFE, 0xFF]
    for dim, global_scale, scale_bytes, row_lo, sort_ids in (
        (256, 0.0123456, list(range(256)), 3, False),
        (32, 2.0**-130, edge_bytes, 0, True),  # subnormal float32 products
        (32, 3.0e36, edge_bytes, 2, False),  # products past bf16's range
    ):
        n_bytes = dim // 2
        code_rows = torch.arange(256, dtype=torch.uint8).view(-1, n_bytes)
        weight = code_rows.repeat(len(scale_bytes), 1)
        scale = torch.tensor(scale_bytes, dtype=torch.uint8).repeat_interleave(code_rows.shape[0])
        scale = scale[:, None].expand(-1, dim // 16).contiguous().view(torch.float8_e4m3fn)
        rows = weight.shape[0]
        ids = torch.arange(row_lo - 2, row_lo + rows + 2)
        out = torch.full((ids.numel(), dim), 1.0, dtype=torch.bfloat16)
        nvfp4_gather(weight.data_ptr(), scale.data_ptr(), ids, out, dim, global_scale, row_lo=row_lo,
                     row_hi=row_lo + rows, sort_ids=sort_ids)
        local = ids - row_lo
        want = nvfp4_rows(weight, scale, global_scale, local, (local >= 0) & (local < rows))
        if not torch.equal(out.view(torch.int16), want.view(torch.int16)):
            bad = (out.view(torch.int16) != want.view(torch.int16)).nonzero()[:3].tolist()
            failures.append(("nvfp4", dim, global_scale, bad))
    print("FAILURES", failures)
    """
)


def test_triton_kernel_in_interpreter_equals_torch_decode_bit_for_bit():
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    result = subprocess.run(
        [sys.executable, "-c", KERNEL_CHECK], env=env, capture_output=True, text=True, timeout=600
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "FAILURES []" in result.stdout, result.stdout[-3000:]


def test_torch_path_zeroes_rows_outside_the_shard_and_decodes_the_rest():
    gen = torch.Generator().manual_seed(0)
    weight = torch.randint(0, 256, (50, 128), generator=gen, dtype=torch.uint8)
    scale = torch.randint(100, 150, (50, 8), generator=gen, dtype=torch.uint8).view(torch.float8_e8m0fnu)
    local = torch.tensor([[-1, 0, 49], [50, 7, 7]])
    owned = (local >= 0) & (local < 50)
    got = mxfp4_rows(weight, scale, local, owned)
    assert got.shape == (2, 3, 256) and got.dtype == torch.bfloat16
    assert bool((got[~owned] == 0).all())
    want = dequantize_mxfp4(weight[local[owned]], scale[local[owned]])
    assert torch.equal(got[owned], want)


@pytest.mark.parametrize(
    ("kwargs", "problem"),
    [
        ({"dim": 48}, "dim must be a power of two"),
        ({"ids": torch.zeros(2, 2, dtype=torch.int64)}, "ids must be contiguous 1-d"),
        ({"out": torch.zeros(4, 256)}, "out must be contiguous bf16"),
    ],
)
def test_kernel_arguments_are_checked_before_launch(kwargs, problem):
    from sglang_ds41.engram.split_gather import mxfp4_gather, triton

    if triton is None:
        pytest.skip("triton is not installed")
    args = {
        "ids": torch.zeros(4, dtype=torch.int64),
        "out": torch.zeros(4, 256, dtype=torch.bfloat16),
        "dim": 256,
    }
    args |= kwargs
    with pytest.raises(ValueError, match=problem):
        mxfp4_gather(0, 0, args["ids"], args["out"], args["dim"])
