import pytest
import torch

from sglang_ds41.formats import e2m1
from sglang_ds41.formats.checks import FormatError

# Written out from the E2M1 definition: sign bit 3, magnitude index 0..7.
TABLE = [0, 0.5, 1, 1.5, 2, 3, 4, 6, -0.0, -0.5, -1, -1.5, -2, -3, -4, -6]


def test_decode_table_matches_all_16_codes():
    got = e2m1.decode(torch.arange(16, dtype=torch.uint8))
    assert got.tolist() == TABLE
    # Codes 8..15 carry the sign bit, including negative zero.
    assert torch.signbit(got).tolist() == [False] * 8 + [True] * 8


def test_encode_of_decode_is_identity_except_negative_zero():
    codes = torch.arange(16, dtype=torch.uint8)
    back = e2m1.encode(e2m1.decode(codes))
    expected = list(range(16))
    expected[8] = 0  # -0.0 encodes as +0 (ModelOpt's sign rule: sign bit = x < 0)
    assert back.tolist() == expected


def test_negative_values_rounding_to_zero_keep_the_sign_bit():
    assert e2m1.encode(torch.tensor([-0.1, -0.25, 0.25, -0.0])).tolist() == [8, 8, 0, 0]


@pytest.mark.parametrize(
    ("midpoint", "even_code"),
    [(0.25, 0), (0.75, 2), (1.25, 2), (1.75, 4), (2.5, 4), (3.5, 6), (5.0, 6)],
)
def test_every_midpoint_rounds_to_the_even_code(midpoint, even_code):
    x = torch.tensor([midpoint, -midpoint])
    assert e2m1.encode(x).tolist() == [even_code, even_code | 8]
    # Just off the midpoint, plain nearest rounding decides.
    below = torch.nextafter(x[:1], torch.tensor([0.0]))
    above = torch.nextafter(x[:1], torch.tensor([10.0]))
    lower_code = int((torch.tensor(TABLE[:8]) < midpoint).sum()) - 1
    assert e2m1.encode(below).tolist() == [lower_code]
    assert e2m1.encode(above).tolist() == [lower_code + 1]


def test_saturates_to_six():
    x = torch.tensor([6.0, 6.5, 7.0, 1e30, float("inf"), -6.5, -float("inf")])
    assert e2m1.encode(x).tolist() == [7, 7, 7, 7, 7, 15, 15]


def test_pack_puts_even_column_in_low_nibble():
    assert e2m1.pack(torch.tensor([1, 2], dtype=torch.uint8)).tolist() == [0x21]
    codes = torch.tensor([[0xF, 0x0, 0x3, 0xA]], dtype=torch.uint8)
    assert e2m1.pack(codes).tolist() == [[0x0F, 0xA3]]


def test_unpack_reverses_a_hand_packed_byte_and_accepts_int8():
    assert e2m1.unpack(torch.tensor([0x21, 0xA3], dtype=torch.uint8)).tolist() == [1, 2, 3, 10]
    # Checkpoints store MXFP4 codes as I8: 0xF7 is -9 as int8.
    assert e2m1.unpack(torch.tensor([-9], dtype=torch.int8)).tolist() == [7, 15]


def test_unpack_accepts_torch_packed_fp4_dtype():
    fp4 = getattr(torch, "float4_e2m1fn_x2", None)
    if fp4 is None:
        pytest.skip("torch has no float4_e2m1fn_x2")
    packed = torch.tensor([0x21], dtype=torch.uint8).view(fp4)
    assert e2m1.unpack(packed).tolist() == [1, 2]


def test_pack_unpack_round_trip_on_all_pairs():
    codes = torch.cartesian_prod(torch.arange(16), torch.arange(16)).to(torch.uint8).reshape(1, -1)
    assert torch.equal(e2m1.unpack(e2m1.pack(codes)), codes)


def test_decode_packed_gives_the_values_of_both_nibbles_of_every_byte():
    every_byte = torch.arange(256, dtype=torch.uint8).reshape(2, 128)
    expected = [[e2m1.VALUES[b & 15] for b in row] for row in every_byte.tolist()]
    got = e2m1.decode_packed(every_byte)
    assert got.dtype == torch.float32 and got.shape == (2, 256)
    assert got[:, 0::2].tolist() == expected  # low nibble: even column
    assert got[:, 1::2].tolist() == [[e2m1.VALUES[b >> 4] for b in row] for row in every_byte.tolist()]
    assert got.signbit().tolist() == e2m1.decode(e2m1.unpack(every_byte)).signbit().tolist()  # -0.0 kept
    assert torch.equal(e2m1.decode_packed(every_byte.view(torch.int8)), got)


def test_bad_inputs_raise_format_errors():
    with pytest.raises(FormatError, match="last dim must be even"):
        e2m1.pack(torch.zeros(3, dtype=torch.uint8))
    with pytest.raises(FormatError, match="uint8/int8"):
        e2m1.unpack(torch.zeros(3, dtype=torch.float32))
    with pytest.raises(FormatError, match="uint8/int8"):
        e2m1.decode_packed(torch.zeros(3, dtype=torch.float32))
