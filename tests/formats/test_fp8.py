import pytest
import torch

from sglang_ds41.formats import fp8
from sglang_ds41.formats.checks import FormatError
from sglang_ds41.formats.fp8 import (
    dequantize_fp8_block2d,
    dequantize_fp8_rows,
    quantize_fp8_block2d,
    quantize_fp8_rows,
)


def _row(*blocks: list[float], block: int = 32) -> torch.Tensor:
    return torch.cat([torch.tensor(b + [0.0] * (block - len(b))) for b in blocks])


def test_rows_hand_computed_bytes():
    # Block 0: amax 7 -> s = 2**ceil(log2(7/448)) = 2**-6; x*64 = 448, 64, -192, 0.64 -> 0.625.
    # Block 1: amax 7.5 -> 7.5/448 > 2**-6 -> s = 2**-5; 7.5*32 = 240.
    # Block 2: all zero -> scale byte 0, codes 0.
    x = _row([7.0, 1.0, -3.0, 0.01], [7.5], []).reshape(1, 96)
    values, scales = quantize_fp8_rows(x)
    assert values.dtype == torch.float8_e4m3fn and scales.dtype == torch.float8_e8m0fnu
    assert scales.view(torch.uint8).tolist() == [[121, 122, 0]]
    raw = values.view(torch.uint8)[0]
    assert raw[:4].tolist() == [0x7E, 0x68, 0xF4, 0x32]
    assert raw[32].item() == 0x77
    assert raw[4:32].eq(0).all() and raw[33:].eq(0).all()
    back = dequantize_fp8_rows(values, scales, dtype=torch.float32)[0]
    assert back[:4].tolist() == [7.0, 1.0, -3.0, 0.009765625]
    assert back[32].item() == 7.5


def test_rows_round_ties_to_even():
    # amax 448 -> scale 1; E4M3 spacing in [16, 32) is 2: 17 -> 16, 19 -> 20 (even mantissas).
    values, scales = quantize_fp8_rows(_row([448.0, 17.0, 19.0, -17.0]))
    assert scales.view(torch.uint8).tolist() == [127]
    assert values.view(torch.uint8)[:4].tolist() == [0x7E, 0x58, 0x5A, 0xD8]


def test_to_e4m3_saturates_instead_of_making_nan():
    got = fp8.to_e4m3(torch.tensor([500.0, -1e9, float("inf")])).float()
    assert got.tolist() == [448.0, -448.0, 448.0]


def test_rows_non_finite_block_gets_nan_scale():
    _, scales = quantize_fp8_rows(_row([float("inf")], [1.0]))
    assert scales.view(torch.uint8).tolist() == [255, 127 - 8]


def test_rows_relative_error_within_half_ulp_for_normal_values():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(64, 256, generator=g) * torch.logspace(-6, 6, 256).reshape(1, 256)
    values, scales = quantize_fp8_rows(x)
    back = dequantize_fp8_rows(values, scales, dtype=torch.float32)
    s = scales.view(torch.uint8).float().sub(127).exp2().repeat_interleave(32, dim=-1)
    normal = (x / s).abs() >= 2.0**-6  # E4M3 min normal
    err = (back - x).abs()
    assert (err[normal] <= x.abs()[normal] * 2.0**-4).all()
    # Subnormals: absolute error at most half the subnormal step 2**-9.
    assert (err[~normal] <= s[~normal] * 2.0**-10).all()


def test_rows_quantize_of_dequantize_is_identity():
    g = torch.Generator().manual_seed(1)
    raw = torch.randint(0, 0x7F, (8, 128), generator=g, dtype=torch.uint8)  # no NaN (0x7F)
    raw[:, ::32] = torch.randint(0x78, 0x7F, (8, 4), generator=g, dtype=torch.uint8)  # |v| >= 256
    raw |= torch.randint(0, 2, raw.shape, generator=g, dtype=torch.uint8) << 7  # random signs
    scales = torch.randint(0, 240, (8, 4), generator=g, dtype=torch.uint8)
    x = dequantize_fp8_rows(raw, scales, dtype=torch.float32)
    values, scales2 = quantize_fp8_rows(x)
    assert torch.equal(scales2.view(torch.uint8), scales)
    # Compare values (not bytes): E4M3 has only one zero that survives +-0 alike.
    assert torch.equal(values.float(), raw.view(torch.float8_e4m3fn).float())


def test_block2d_hand_computed_with_ragged_edges():
    w = torch.zeros(33, 40)
    w[0, 0] = 448.0  # block (0,0): s = 1
    w[1, 1] = 17.0  # tie in block (0,0) -> 16
    w[32, 0] = 7.0  # block (1,0): s = 2**-6
    w[0, 39] = 0.5  # block (0,1): 0.5/448 -> s = 2**-9, stored as 256
    weight, scale = quantize_fp8_block2d(w)
    assert weight.shape == (33, 40) and scale.shape == (2, 2)
    assert scale.view(torch.uint8).tolist() == [[127, 118], [121, 0]]
    assert weight.float()[0, 39].item() == 256.0 and weight.float()[32, 0].item() == 448.0
    expected = w.clone()
    expected[1, 1] = 16.0
    assert torch.equal(dequantize_fp8_block2d(weight, scale, dtype=torch.float32), expected)


def test_block2d_matches_per_block_oracle():
    g = torch.Generator().manual_seed(2)
    w = torch.randn(70, 100, generator=g)
    weight, scale = quantize_fp8_block2d(w)
    for i in range(3):
        for j in range(4):
            blk = w[32 * i : 32 * i + 32, 32 * j : 32 * j + 32]
            e = int(torch.ceil(torch.log2(blk.abs().max() / 448)).item())
            assert scale.view(torch.uint8)[i, j].item() == e + 127
            ref = (blk * 2.0**-e).to(torch.float8_e4m3fn).float() * 2.0**e
            got = dequantize_fp8_block2d(weight, scale, dtype=torch.float32)
            assert torch.equal(got[32 * i : 32 * i + 32, 32 * j : 32 * j + 32], ref)


def test_dequantize_default_dtype_is_bf16_and_accepts_uint8_views():
    values, scales = quantize_fp8_rows(torch.ones(2, 32))
    out = dequantize_fp8_rows(values.view(torch.uint8), scales.view(torch.uint8))
    assert out.dtype == torch.bfloat16 and out.eq(1).all()


def test_shape_and_dtype_errors_are_clear():
    with pytest.raises(FormatError, match="fp8 rows: last dim 100 is not a multiple of 32"):
        quantize_fp8_rows(torch.zeros(2, 100))
    with pytest.raises(FormatError, match="floating-point"):
        quantize_fp8_rows(torch.zeros(2, 32, dtype=torch.int32))
    values, scales = quantize_fp8_rows(torch.zeros(2, 64))
    with pytest.raises(FormatError, match=r"fp8 rows scales: expected shape \[2, 2\], got \[2, 1\]"):
        dequantize_fp8_rows(values, scales[:, :1])
    with pytest.raises(FormatError, match="2-D"):
        quantize_fp8_block2d(torch.zeros(2, 2, 2))
    weight, scale = quantize_fp8_block2d(torch.zeros(64, 64))
    with pytest.raises(FormatError, match="float8_e4m3fn or uint8"):
        dequantize_fp8_block2d(weight.float(), scale)
