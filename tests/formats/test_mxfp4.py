import pytest
import torch

from sglang_ds41.formats.checks import FormatError
from sglang_ds41.formats.fp8 import quantize_fp8_rows
from sglang_ds41.formats.mxfp4 import dequantize_mxfp4, fp8_rows_to_mxfp4, quantize_mxfp4


def _row(*blocks: list[float]) -> torch.Tensor:
    return torch.cat([torch.tensor(b + [0.0] * (32 - len(b))) for b in blocks])


def test_hand_computed_blocks():
    # Block 0: amax 5 -> exponent floor(log2 5) - 2 = 0; 5 ties to 4 (code 6), -2.5 ties to -2
    #          (code 0xC), 0.3 -> 0.5 (code 1). Bytes: 0xC6, 0x01.
    # Block 1: amax 7 -> exponent 0; 7 and 6.5 saturate to 6 (code 7), 0.75 ties to 1 (code 2).
    # Block 2: amax 0.1 -> exponent -4 - 2 = -6; x*64: 6.4 -> 6, 3.2 -> 3, -1.28 -> -1.5.
    # Block 3: zero -> scale byte 0 (documented choice), codes 0.
    x = _row([5.0, -2.5, 0.3], [7.0, 6.5, 0.75], [0.1, 0.05, -0.02], []).reshape(1, 128)
    codes, scales = quantize_mxfp4(x)
    assert codes.dtype == torch.uint8 and codes.shape == (1, 64)
    assert scales.dtype == torch.float8_e8m0fnu and scales.shape == (1, 4)
    assert scales.view(torch.uint8).tolist() == [[127, 127, 121, 0]]
    c = codes[0].tolist()
    assert c[0:2] == [0xC6, 0x01] and c[16:18] == [0x77, 0x02] and c[32:34] == [0x57, 0x0B]
    assert all(b == 0 for i, b in enumerate(c) if i not in (0, 1, 16, 17, 32, 33))
    back = dequantize_mxfp4(codes, scales, dtype=torch.float32)[0]
    assert back[[0, 1, 2, 32, 33, 34, 64, 65, 66]].tolist() == [
        4.0, -2.0, 0.5, 6.0, 6.0, 1.0, 6 / 64, 3 / 64, -1.5 / 64,
    ]


def test_dequantize_accepts_int8_codes_and_uint8_scales():
    codes = torch.full((1, 16), 0x21, dtype=torch.uint8).view(torch.int8)
    scales = torch.tensor([[128]], dtype=torch.uint8)
    out = dequantize_mxfp4(codes, scales)
    assert out.dtype == torch.bfloat16
    assert out[0, :4].tolist() == [1.0, 2.0, 1.0, 2.0]  # codes 1, 2 = 0.5, 1.0 times 2**1


def test_error_within_half_ulp_except_saturated_elements():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(32, 512, generator=g) * torch.logspace(-4, 4, 512).reshape(1, 512)
    codes, scales = quantize_mxfp4(x)
    back = dequantize_mxfp4(codes, scales, dtype=torch.float32)
    s = scales.view(torch.uint8).float().sub(127).exp2().repeat_interleave(32, dim=-1)
    m = x.abs() / s  # magnitude on the E2M1 grid
    half_ulp = torch.where(m < 2, 0.25, torch.where(m < 4, 0.5, 1.0)) * s
    err = (back - x).abs()
    inside = m <= 6
    assert (err[inside] <= half_ulp[inside]).all()
    # OCP scale: the block max lies in [4, 8) * s, so saturated elements lose less than 2 * s.
    assert torch.equal(err[~inside], (x.abs() - 6 * s)[~inside])
    assert (err[~inside] < 2 * s[~inside]).all()


def test_quantize_of_dequantize_is_identity():
    g = torch.Generator().manual_seed(1)
    codes = torch.randint(0, 16, (16, 256), generator=g, dtype=torch.uint8)
    codes[codes == 8] = 0  # -0 re-encodes as +0 (documented)
    codes[:, ::32] = torch.randint(6, 8, (16, 8), generator=g, dtype=torch.uint8)  # block max 4 or 6
    scales = torch.randint(0, 253, (16, 8), generator=g, dtype=torch.uint8)
    packed = (codes[:, 0::2] | (codes[:, 1::2] << 4)).contiguous()
    x = dequantize_mxfp4(packed, scales, dtype=torch.float32)
    packed2, scales2 = quantize_mxfp4(x)
    assert torch.equal(packed2, packed)
    assert torch.equal(scales2.view(torch.uint8), scales)


def test_non_finite_block_gets_nan_scale_and_dequantises_to_nan():
    x = _row([float("nan")], [1.0]).reshape(1, 64)
    codes, scales = quantize_mxfp4(x)
    assert scales.view(torch.uint8).tolist() == [[255, 125]]
    back = dequantize_mxfp4(codes, scales, dtype=torch.float32)
    assert back[0, :32].isnan().all() and back[0, 32].item() == 1.0


def test_fp8_rows_convert_exactly_then_requantise():
    # FP8 row: scale 2**-6; stored 448 and 64 are 7.0 and 1.0; MXFP4: amax 7 -> exponent 0,
    # 7 saturates to 6 (code 7), 1 is code 2 -> byte 0x27.
    values, scales = quantize_fp8_rows(_row([7.0, 1.0]).reshape(1, 32))
    codes, mx_scales = fp8_rows_to_mxfp4(values, scales)
    assert mx_scales.view(torch.uint8).tolist() == [[127]]
    assert codes[0, 0].item() == 0x27 and codes[0, 1:].eq(0).all()


def test_safetensors_round_trip_keeps_dtypes(tmp_path):
    from safetensors import safe_open
    from safetensors.torch import save_file

    x = torch.randn(4, 64, generator=torch.Generator().manual_seed(3))
    codes, scales = quantize_mxfp4(x)
    save_file({"w": codes, "s": scales}, tmp_path / "t.safetensors")
    with safe_open(tmp_path / "t.safetensors", "pt") as f:
        w, s = f.get_tensor("w"), f.get_tensor("s")
    assert s.dtype == torch.float8_e8m0fnu
    assert torch.equal(dequantize_mxfp4(w, s), dequantize_mxfp4(codes, scales))


def test_bad_shapes_raise_clear_errors():
    with pytest.raises(FormatError, match="mxfp4: last dim 100 is not a multiple of 32"):
        quantize_mxfp4(torch.zeros(2, 100))
    codes, scales = quantize_mxfp4(torch.zeros(2, 64))
    with pytest.raises(FormatError, match=r"mxfp4 scales: expected shape \[2, 2\], got \[2, 1\]"):
        dequantize_mxfp4(codes, scales[:, :1])
    with pytest.raises(FormatError, match="float8_e8m0fnu or uint8"):
        dequantize_mxfp4(codes, scales.float())


# --- the least-squares (mse) scale rule -----------------------------------------------------------

from hypothesis import example, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from tests.formats import oracles  # noqa: E402


def _fp8_value_block() -> st.SearchStrategy[list[float]]:
    """32 E4M3 values times one power of two: a block of an FP8 Engram row, as the converter sees it."""
    finite = [b for b in range(256) if (b & 0x7F) != 0x7F]
    return st.tuples(st.lists(st.sampled_from(finite), min_size=32, max_size=32), st.integers(-40, 40)).map(
        lambda t: [oracles.e4m3_value(b) * 2.0 ** t[1] for b in t[0]]
    )


_float_block = st.lists(
    st.one_of(st.just(0.0), st.floats(-1e6, 1e6, allow_nan=False, width=32)), min_size=32, max_size=32
)


def _blocks(block: list[float], rule: str) -> tuple[list[float], list[int], bytes]:
    codes, scales = quantize_mxfp4(torch.tensor(block).reshape(1, 32), rule)
    decoded = dequantize_mxfp4(codes, scales, dtype=torch.float32)[0].tolist()
    return decoded, scales.view(torch.uint8)[0].tolist(), bytes(codes[0].tolist())


@settings(max_examples=400, deadline=None)
@given(st.one_of(_fp8_value_block(), _float_block))
def test_mse_never_has_a_larger_block_error_than_ocp_and_decodes_with_the_mxfp4_decoder(block):
    if not any(block):
        return
    ocp, ocp_scale, _ = _blocks(block, "ocp")
    mse, mse_scale, mse_codes = _blocks(block, "mse")
    # the unchanged MXFP4 decoder and an independent one read the mse bytes alike
    assert mse == oracles.mx_decode(mse_codes, bytes(mse_scale))
    e_ocp, e_mse = oracles.squared_error(ocp, block), oracles.squared_error(mse, block)
    assert e_mse <= e_ocp
    # the choice is the best of OCP's exponent and its two neighbours, each re-rounded per value
    e0 = oracles.ocp_exponent(block)
    assert ocp_scale[0] == e0 + 127
    candidates = [oracles.squared_error(oracles.mx_values(block, e0 + d), block) for d in (0, 1, -1)]
    assert e_mse == pytest.approx(min(candidates), rel=1e-12, abs=0)
    assert mse == oracles.mx_values(block, mse_scale[0] - 127)


def test_mse_takes_the_larger_exponent_when_ocp_saturates():
    # amax 7.5: OCP exponent 0 clips every 7.5 to 6 (error 1.5**2 each); exponent 1 rounds
    # 7.5 / 2 = 3.75 to 4, i.e. 8 (error 0.5**2 each). Code 6 in both nibbles: 0x66; scale 128.
    x = torch.full((1, 32), 7.5)
    codes, scales = quantize_mxfp4(x, "mse")
    assert scales.view(torch.uint8).tolist() == [[128]] and codes.eq(0x66).all()
    codes, scales = quantize_mxfp4(x, "ocp")
    assert scales.view(torch.uint8).tolist() == [[127]] and codes.eq(0x77).all()


def test_mse_takes_the_smaller_exponent_when_it_fits_the_rest_exactly():
    # [4, 0.75 x 31]: OCP exponent 0 ties every 0.75 to 1 (error 31 * 0.0625 = 1.94); exponent
    # -1 clips 4 to 3 (error 1) and holds 0.75 = 1.5 * 0.5 exactly. Bytes: (code 7 | code 3 << 4).
    x = torch.tensor([[4.0] + [0.75] * 31])
    codes, scales = quantize_mxfp4(x, "mse")
    assert scales.view(torch.uint8).tolist() == [[126]]
    assert codes[0, 0].item() == 0x37 and codes[0, 1:].eq(0x33).all()
    assert dequantize_mxfp4(codes, scales, torch.float32)[0, :2].tolist() == [3.0, 0.75]


def test_mse_keeps_the_ocp_scale_on_a_tie_and_for_zero_and_nan_blocks():
    exact = torch.tensor([[4.0, 2.0, 1.0, -0.5] + [0.0] * 28])  # exact under OCP: error 0
    special = _row([], [float("nan"), 1.0]).reshape(1, 64)
    for x in (exact, special):
        ocp, mse = quantize_mxfp4(x, "ocp"), quantize_mxfp4(x, "mse")
        assert torch.equal(ocp[0], mse[0]) and torch.equal(ocp[1].view(torch.uint8), mse[1].view(torch.uint8))


def test_unknown_scale_rule_is_refused():
    with pytest.raises(FormatError, match=r"unknown scale rule 'best'; expected one of \['ocp', 'mse'\]"):
        quantize_mxfp4(torch.ones(1, 32), "best")


@settings(max_examples=300, deadline=None)
@given(_fp8_value_block())
@example([7.5] * 32)  # OCP saturates every value
@example([4.0] + [0.75] * 31)  # the smaller exponent holds the rest exactly
def test_mse_is_the_least_squares_mxfp4_encoding_of_an_fp8_block_over_every_scale(block):
    # With one scale per block, rounding each value to its nearest E2M1 point (clipping at 6) is
    # the least-squares choice of codes, so the least-squares MXFP4 encoding of a block is the best
    # of the 254 finite E8M0 scales, each with nearest rounding. The mse rule only tries OCP's
    # exponent and its two neighbours; on blocks of FP8 values (what the converter re-encodes)
    # that already is the optimum: no MXFP4 encoding of the block has a smaller squared error.
    if not any(block):
        return
    mse, _, _ = _blocks(block, "mse")
    best = min(oracles.squared_error(oracles.mx_values(block, e), block) for e in range(-127, 128))
    assert oracles.squared_error(mse, block) == pytest.approx(best, rel=1e-12, abs=0)
