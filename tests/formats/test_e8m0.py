import math

import pytest
import torch

from sglang_ds41.errors import Ds41Error
from sglang_ds41.formats import e8m0
from sglang_ds41.formats.checks import FormatError


def test_all_256_bytes_decode_to_powers_of_two_and_255_is_nan():
    raw = torch.arange(256, dtype=torch.uint8)
    expected = [math.ldexp(1.0, b - 127) for b in range(255)]
    for scales in (raw, raw.view(torch.float8_e8m0fnu)):
        got = e8m0.decode(scales)
        assert got.dtype == torch.float32
        assert got[:255].double().tolist() == expected
        assert math.isnan(got[255].item())


def test_decode_agrees_with_torch_float8_e8m0fnu_cast():
    raw = torch.arange(255, dtype=torch.uint8)
    assert torch.equal(e8m0.decode(raw), raw.view(torch.float8_e8m0fnu).float())


def test_pow2_is_exact_over_the_whole_exponent_range():
    exps = torch.arange(-127, 128)
    assert e8m0.pow2(exps).double().tolist() == [math.ldexp(1.0, int(e)) for e in exps]


def test_encode_clamps_exponents_and_marks_invalid_as_nan():
    exps = torch.tensor([-200, -127, 0, 5, 127, 300, 0])
    invalid = torch.tensor([False] * 6 + [True])
    got = e8m0.encode(exps, invalid)
    assert got.dtype == torch.float8_e8m0fnu
    assert got.view(torch.uint8).tolist() == [0, 0, 127, 132, 254, 254, 255]


def test_log2_helpers_are_exact_at_and_around_powers_of_two():
    x = torch.tensor([1.0, 2.0, 0.5, 2.0**-140, 3.0, 448.0])
    assert e8m0.floor_log2(x).tolist() == [0, 1, -1, -140, 1, 8]
    assert e8m0.ceil_log2(x).tolist() == [0, 1, -1, -140, 2, 9]
    above_one = torch.nextafter(torch.tensor([1.0]), torch.tensor([2.0]))
    below_one = torch.nextafter(torch.tensor([1.0]), torch.tensor([0.0]))
    assert e8m0.ceil_log2(above_one).tolist() == [1]
    assert e8m0.floor_log2(below_one).tolist() == [-1]


def test_ceil_scale_exponent_handles_zero_and_floor():
    amax = torch.tensor([0.0, 448.0, 449.0, 0.0])
    assert e8m0.ceil_scale_exponent(amax, 448.0).tolist() == [-127, 0, 1, -127]
    # With a floor of 448 * 2**-3 an all-zero block gets 2**-3.
    assert e8m0.ceil_scale_exponent(amax[:1], 448.0, amax_floor=56.0).tolist() == [-3]


def test_wrong_dtype_is_a_user_facing_error():
    with pytest.raises(FormatError, match=r"float8_e8m0fnu or uint8, got torch\.int32"):
        e8m0.decode(torch.zeros(2, dtype=torch.int32))
    assert issubclass(FormatError, Ds41Error)
