"""Packed rows of the slot store: the model's own KV quantisers, stored as bytes, lossless."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from sglang_ds41.backend.kv_codec import index_codec, latent_codec, window_codec
from sglang_ds41.formats.kv_quant import fake_quant_index_fp4, fake_quant_latent_fp4, fake_quant_window_fp8
from sglang_ds41.formats.mxfp4 import dequantize_mxfp4

CODECS = [
    (window_codec, fake_quant_window_fp8, 512, 528),
    (latent_codec, fake_quant_latent_fp4, 512, 288),
    (index_codec, fake_quant_index_fp4, 128, 68),
]


@pytest.mark.parametrize(("codec", "fake_quant", "dim", "row_bytes"), CODECS)
def test_row_sizes_are_the_model_s_native_layouts(codec, fake_quant, dim, row_bytes):
    assert codec(dim).row_bytes == row_bytes  # MODEL.md §4.6


def _rows(seed: int, log2_scale: int, dtype: torch.dtype, dim: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(6, dim, generator=gen, dtype=torch.float64) * 2.0**log2_scale
    x[1] = 0  # all-zero rows / blocks
    x[2, : dim // 2] = 0
    x[3] *= torch.rand(dim, generator=gen, dtype=torch.float64) ** 8  # wide dynamic range in a block
    return x.to(dtype)


DTYPES = [torch.float64, torch.float32, torch.bfloat16]


@pytest.mark.parametrize(("codec", "fake_quant", "dim", "row_bytes"), CODECS)
@pytest.mark.parametrize("dtype", DTYPES)
@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 2**31), log2_scale=st.integers(-12, 8))
def test_stored_rows_decode_to_the_model_s_fake_quantised_rows(
    codec, fake_quant, dim, row_bytes, dtype, seed, log2_scale
):
    x = _rows(seed, log2_scale, dtype, dim)
    c = codec(dim)
    packed = c.encode(x)
    assert packed.dtype == torch.uint8 and packed.shape == (6, row_bytes)
    assert torch.equal(c.decode(packed, dtype), fake_quant(x))


@pytest.mark.parametrize(("codec", "fake_quant", "dim", "row_bytes"), [CODECS[0], CODECS[2]])
@pytest.mark.parametrize("dtype", DTYPES)
@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 2**31), log2_scale=st.integers(-12, 8))
def test_window_and_index_rows_may_be_stored_after_fake_quantisation(
    codec, fake_quant, dim, row_bytes, dtype, seed, log2_scale
):
    """Power-of-two scales: re-quantising a fake-quantised row is exact (the store relies on it)."""
    computed = fake_quant(_rows(seed, log2_scale, dtype, dim))
    c = codec(dim)
    assert torch.equal(c.decode(c.encode(computed), dtype), computed)


def test_index_rows_decode_every_code_byte_and_scale_as_mxfp4_does():
    """The index codec's table decode is `dequantize_mxfp4`, bit for bit: every code byte in
    every position, every scale byte (NaN 255 included), in every compute dtype."""
    codes = ((torch.arange(256)[:, None] + torch.arange(64)[None, :]) % 256).to(torch.uint8)  # [256, 64]
    scales = torch.arange(256)[:, None].expand(-1, 4).to(torch.uint8).contiguous()  # row r: scale byte r
    c = index_codec(128)
    packed = torch.cat([codes, scales], dim=1)
    for dtype in DTYPES:
        want = dequantize_mxfp4(codes, scales, dtype=dtype)
        got = c.decode(packed, dtype)
        assert torch.equal(got.isnan(), want.isnan())
        assert torch.equal(got.nan_to_num(), want.nan_to_num())


def test_latent_rows_must_be_stored_from_the_quantiser_input():
    """E4M3 scales are coarse when subnormal: a small block's re-quantised values can change,
    which is why the store encodes the unquantised entries (`NewEntries.rotated`)."""
    x = torch.zeros(1, 16, dtype=torch.float64)
    x[0, :2] = torch.tensor([0.0193, 0.004])  # amax / 6 = 0.0032 -> E4M3 scale 2**-8
    once = fake_quant_latent_fp4(x)
    assert not torch.equal(fake_quant_latent_fp4(once), once)
    c = latent_codec(16)
    assert torch.equal(c.decode(c.encode(x), torch.float64), once)


@pytest.mark.parametrize(("codec", "fake_quant", "dim", "row_bytes"), CODECS)
def test_decoding_a_gathered_subset_of_rows(codec, fake_quant, dim, row_bytes):
    """The store reads rows by slot id: a gathered, reordered subset decodes row by row."""
    computed = fake_quant(_rows(7, 0, torch.float64, dim))
    c = codec(dim)
    packed = c.encode(computed)
    picks = torch.tensor([4, 0, 4, 2])
    assert torch.equal(c.decode(packed[picks], torch.float64), computed[picks])
