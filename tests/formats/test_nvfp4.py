import pytest
import torch

from sglang_ds41.formats.checks import FormatError
from sglang_ds41.formats.nvfp4 import TENSOR_NAMES, dequantize_nvfp4, global_scale, quantize_nvfp4

GRID = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0]


def _row(*blocks: list[float]) -> torch.Tensor:
    return torch.cat([torch.tensor(b + [0.0] * (16 - len(b))) for b in blocks]).reshape(1, -1)


def test_modelopt_hand_computed_example():
    # Global amax 2688 = 6 * 448 -> weight_scale_2 = 1 exactly.
    # A: amax 2688 -> scale 448 (0x7E); /448: 6, 3, -1.5, 0.75 -> 1 (tie), 0.25 -> 0 (tie),
    #    -0.25 -> -0 (code 8: ModelOpt keeps the sign of negatives that round to zero).
    # B: amax 12 -> scale 2 (0x40); /2: 6, -2.5 -> -2 (tie), 3.5 -> 4 (tie), 0.5.
    # C: amax 13 -> 13/6 = 2.1667 -> E4M3 2.25 (0x41); /2.25: 5.78 -> 6, 1, -4.
    # D: zero -> scale 1.0 (0x38), codes 0.
    w = _row(
        [2688.0, 1344.0, -672.0, 336.0, 112.0, -112.0],
        [12.0, -5.0, 7.0, 1.0],
        [13.0, 2.25, -9.0],
        [],
    )
    weight, weight_scale, weight_scale_2 = quantize_nvfp4(w)
    assert weight.dtype == torch.uint8 and weight.shape == (1, 32)
    assert weight_scale.dtype == torch.float8_e4m3fn and weight_scale.shape == (1, 4)
    assert weight_scale_2.dtype == torch.float32 and weight_scale_2.dim() == 0
    assert weight_scale_2.item() == 1.0
    assert weight_scale.view(torch.uint8).tolist() == [[0x7E, 0x40, 0x41, 0x38]]
    expected = [0] * 32
    expected[0:3] = [0x57, 0x2B, 0x80]
    expected[8:10] = [0xC7, 0x16]
    expected[16:18] = [0x27, 0x0E]
    assert weight[0].tolist() == expected
    back = dequantize_nvfp4(weight, weight_scale, weight_scale_2, dtype=torch.float32)[0]
    assert back[:6].tolist() == [2688.0, 1344.0, -672.0, 448.0, 0.0, 0.0]
    assert back[16:20].tolist() == [12.0, -4.0, 8.0, 1.0]
    assert back[32:35].tolist() == [13.5, 2.25, -9.0]


def _oracle(w: torch.Tensor) -> torch.Tensor:
    """Element-by-element ModelOpt NVFP4 fake-quant, written with Python scalars."""
    ws2 = float(w.abs().max()) / 2688.0
    out = torch.empty_like(w)
    for r in range(w.shape[0]):
        for b in range(0, w.shape[1], 16):
            amax = float(w[r, b : b + 16].abs().max())
            s = torch.tensor(amax / (6 * ws2) if amax else 1.0).to(torch.float8_e4m3fn).float().item()
            denom = torch.tensor(s, dtype=torch.float32) * torch.tensor(ws2, dtype=torch.float32)
            for j in range(b, b + 16):
                q = min(abs(float(w[r, j] / denom)), 6.0)
                dist = [abs(q - g) for g in GRID]
                best = min(range(8), key=lambda i: (dist[i], i % 2))  # nearest, ties to even code
                out[r, j] = (-1 if w[r, j] < 0 else 1) * GRID[best] * float(denom)
    return out


def test_matches_element_by_element_oracle():
    g = torch.Generator().manual_seed(0)
    w = torch.randn(4, 64, generator=g) * torch.logspace(-2, 1, 64).reshape(1, 64)
    weight, weight_scale, weight_scale_2 = quantize_nvfp4(w)
    assert weight_scale_2.item() == pytest.approx(w.abs().max().item() / 2688, rel=1e-7)
    got = dequantize_nvfp4(weight, weight_scale, weight_scale_2, dtype=torch.float32)
    torch.testing.assert_close(got, _oracle(w), rtol=1e-6, atol=0)


def test_shared_global_scale_and_error_bound():
    g = torch.Generator().manual_seed(1)
    w = torch.randn(8, 128, generator=g)
    weight, weight_scale, ws2 = quantize_nvfp4(w, weight_scale_2=torch.tensor(0.01))
    assert ws2.item() == pytest.approx(0.01)
    back = dequantize_nvfp4(weight, weight_scale, ws2, dtype=torch.float32)
    block_scale = weight_scale.float().repeat_interleave(16, dim=-1) * ws2
    assert ((back - w).abs() <= block_scale + 1e-7).all()  # at most half of the widest E2M1 step


def test_all_zero_tensor_dequantises_to_zero():
    weight, weight_scale, ws2 = quantize_nvfp4(torch.zeros(2, 32))
    assert ws2.item() == 0.0 and weight.eq(0).all()
    assert dequantize_nvfp4(weight, weight_scale, ws2).eq(0).all()


def test_names_and_global_scale_follow_modelopt():
    assert TENSOR_NAMES == ("weight", "weight_scale", "weight_scale_2", "input_scale")
    assert global_scale(2688.0).item() == 1.0


def test_bad_inputs_raise_clear_errors():
    with pytest.raises(FormatError, match="nvfp4: last dim 40 is not a multiple of 16"):
        quantize_nvfp4(torch.zeros(2, 40))
    weight, weight_scale, ws2 = quantize_nvfp4(torch.ones(2, 32))
    with pytest.raises(FormatError, match=r"weight_scale: expected shape \[2, 2\]"):
        dequantize_nvfp4(weight, weight_scale[:, :1], ws2)
    with pytest.raises(FormatError, match="weight_scale_2: expected a scalar"):
        dequantize_nvfp4(weight, weight_scale, torch.ones(2))


def test_mxfp4_to_nvfp4_keeps_every_dequantised_value() -> None:
    from sglang_ds41.formats import dequantize_mxfp4, mxfp4_to_nvfp4, quantize_mxfp4

    gen = torch.Generator().manual_seed(7)
    # Rows of very different magnitudes so the block exponents spread over many binades.
    w = torch.randn(8, 64, generator=gen) * torch.logspace(-1.5, 1.5, 8).unsqueeze(-1)
    codes, scales = quantize_mxfp4(w)
    weight, weight_scale, weight_scale_2 = mxfp4_to_nvfp4(codes, scales)
    assert torch.equal(weight, codes)
    mx = dequantize_mxfp4(codes, scales, torch.float32)
    nv = dequantize_nvfp4(weight, weight_scale, weight_scale_2, torch.float32)
    assert torch.equal(mx, nv)


def test_mxfp4_to_nvfp4_refuses_scales_beyond_e4m3_range() -> None:
    from sglang_ds41.formats import FormatError, mxfp4_to_nvfp4

    scales = torch.tensor([[127 - 20, 127 + 5]], dtype=torch.uint8)  # 25 binades apart
    with pytest.raises(FormatError, match="losslessly"):
        mxfp4_to_nvfp4(torch.zeros(1, 32, dtype=torch.uint8), scales)
