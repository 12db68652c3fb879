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


# --- NVFP4 Engram tables: from FP8 rows, ModelOpt or least-squares scales --------------------------

from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from tests.formats import oracles  # noqa: E402


def _fp8_rows(rows: int, seed: int, spread: float = 0.0):
    from sglang_ds41.formats import quantize_fp8_rows

    g = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, 64, generator=g) * torch.logspace(-spread, spread, rows).reshape(rows, 1)
    return quantize_fp8_rows(x)


@pytest.mark.parametrize("rule", ["modelopt", "mse"])
@pytest.mark.parametrize(("spread", "seed"), [(0.0, 0), (6.0, 1)])
def test_fp8_rows_to_nvfp4_equals_an_independent_per_value_encoder(rule, spread, seed):
    from sglang_ds41.formats import dequantize_fp8_rows, fp8_rows_to_nvfp4

    values, scales = _fp8_rows(12, seed, spread)  # spread: rows over 12 decades, blocks near flushing
    weight, weight_scale, ws2 = fp8_rows_to_nvfp4(values, scales, scale_rule=rule)
    top = int(scales.view(torch.uint8).max())
    assert ws2.dtype == torch.float32 and ws2.item() == oracles.f32(2.0 ** (top - 127) / 6)
    exact = dequantize_fp8_rows(values, scales, dtype=torch.float32).tolist()
    got = dequantize_nvfp4(weight, weight_scale, ws2, torch.float32).tolist()
    for r, row in enumerate(exact):
        for b in range(0, 64, 16):
            byte, codes = oracles.nv_block(row[b : b + 16], ws2.item(), rule)
            assert weight_scale[r, b // 16].view(torch.uint8).item() == byte, (r, b)
            assert got[r][b : b + 16] == oracles.nv_dequant(byte, codes, ws2.item()), (r, b)
    blocks = [oracles.nv_block(exact[0][b : b + 16], ws2.item(), rule)[1] for b in range(0, 64, 16)]
    packed = [c for block in blocks for c in block]
    packed = [c & 15 for c in packed]
    assert weight[0].tolist() == [packed[i] | packed[i + 1] << 4 for i in range(0, 64, 2)]


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.floats(-1e4, 1e4, allow_nan=False, width=32), min_size=16, max_size=16),
    st.floats(2.0**-20, 128.0, width=32),
)
def test_mse_never_has_a_larger_block_error_than_modelopt(block, ws2):
    w = torch.tensor(block).reshape(1, 16)
    errors = []
    for rule in ("modelopt", "mse"):
        weight, weight_scale, g = quantize_nvfp4(w, torch.tensor(ws2), scale_rule=rule)
        decoded = dequantize_nvfp4(weight, weight_scale, g, torch.float32)[0].tolist()
        byte, codes = oracles.nv_block(block, ws2, rule)
        assert decoded == oracles.nv_dequant(byte, codes, ws2)
        errors.append(oracles.squared_error(decoded, block))
    assert errors[1] <= errors[0] * (1 + 1e-12)


def test_global_scale_comes_from_the_fp8_scale_bytes_alone():
    from sglang_ds41.formats import fp8_rows_global_scale

    scales = torch.tensor([[120, 133, 255], [127, 0, 101]], dtype=torch.uint8)  # 255 = NaN: ignored
    assert fp8_rows_global_scale(scales).item() == oracles.f32(2.0**6 / 6)  # 448 * 2**6 / (6 * 448)
    top = torch.tensor([[254]], dtype=torch.uint8)  # the bound 448 * 2**127 overflows float32 ...
    assert fp8_rows_global_scale(top).item() == oracles.f32(2.0**127 / 6)  # ... the scale does not
    # every FP8 block's amax lies within 6 * 448 * weight_scale_2: no block scale saturates
    values, scales = _fp8_rows(8, 3, spread=2.0)
    from sglang_ds41.formats import dequantize_fp8_rows

    amax = dequantize_fp8_rows(values, scales, dtype=torch.float64).abs().max()
    assert amax <= 6 * 448 * fp8_rows_global_scale(scales).double() * (1 + 1e-7)


def test_mse_picks_a_neighbouring_scale_when_it_fits_better():
    # ws2 = 1, block [6.5, 1.0 x 15]: ModelOpt's scale e4m3(6.5 / 6 = 1.083) = 1.125 (0x39)
    # divides 1.0 into 0.889 -> 1 (err 0.125**2 each, 15x) and 6.5 into 5.78 -> 6 (6.75: err 0.0625);
    # scale 1.0 (0x38) holds every 1.0 exactly and clips 6.5 to 6 (err 0.25): 0.25 < 0.297.
    w = torch.tensor([[6.5] + [1.0] * 15])
    _, modelopt_scale, _ = quantize_nvfp4(w, torch.tensor(1.0), scale_rule="modelopt")
    weight, mse_scale, ws2 = quantize_nvfp4(w, torch.tensor(1.0), scale_rule="mse")
    assert modelopt_scale.view(torch.uint8).item() == 0x39 and mse_scale.view(torch.uint8).item() == 0x38
    assert dequantize_nvfp4(weight, mse_scale, ws2, torch.float32)[0, :2].tolist() == [6.0, 1.0]


def test_unknown_nvfp4_scale_rule_is_refused():
    with pytest.raises(FormatError, match=r"unknown scale rule 'ocp'; expected one of \['modelopt', 'mse'\]"):
        quantize_nvfp4(torch.ones(1, 16), scale_rule="ocp")
