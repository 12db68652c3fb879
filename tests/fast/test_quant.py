"""The compiled KV quantisers against `formats.kv_quant`, their oracle: the same bytes and the
same dequantised rows, bit for bit, including ties, subnormal scales, signed zeros and any
finite float32 bit pattern; non-finite rows take the oracle."""

from __future__ import annotations

import pytest
import torch

from sglang_ds41.fast import quant
from sglang_ds41.formats import kv_quant

KINDS = [
    (quant.window_fp8, kv_quant.quantize_window_fp8, kv_quant.fake_quant_window_fp8, quant.WINDOW, 64),
    (quant.latent_fp4, kv_quant.quantize_latent_fp4, kv_quant.fake_quant_latent_fp4, quant.LATENT, 64),
    (quant.index_fp4, kv_quant.quantize_index_fp4, kv_quant.fake_quant_index_fp4, quant.INDEX, 32),
]


def rows(dim: int, seed: int) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    out = [torch.randn(64, dim, generator=gen) * scale for scale in (1e-30, 1e-6, 1e-2, 1, 9, 500, 1e6, 1e30)]
    # the rounding ties of E2M1 / E4M3 at many binades, both signs, and zeros of both signs
    ties = torch.tensor(
        [0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 6.0, 0.0, -0.0, 17 / 16, 9 / 8, 15 / 16, 0.1875]
    )
    grid = ties.repeat(dim)[: 8 * dim].view(8, dim)
    signs = torch.where(torch.rand(8, dim, generator=gen) < 0.5, -1.0, 1.0)
    out += [grid * signs * 2.0**p for p in (-20, -9, -3, 0, 4, 8)]
    bits = torch.randint(-(2**31), 2**31 - 1, (512, dim), generator=gen).to(torch.int32).view(torch.float32)
    out.append(torch.where(torch.isfinite(bits), bits, 1.0))  # every finite float32
    out.append(torch.zeros(2, dim))
    return out


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(a.view(torch.uint8), b.view(torch.uint8))


@pytest.mark.parametrize(("fast", "quantize", "fake_quant", "kind", "dim"), KINDS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_bytes_and_rows_equal_the_oracle_bit_for_bit(fast, quantize, fake_quant, kind, dim, dtype):
    for x in rows(dim, seed=dim):
        x = x.to(dtype)
        fake, packed = fast(x)
        codes, scales = quantize(x)
        expected = torch.cat(
            [codes.contiguous().view(torch.uint8), scales.contiguous().view(torch.uint8)], -1
        )
        assert same_bits(packed, expected)
        assert same_bits(fake.contiguous(), fake_quant(x))
        assert same_bits(quant.decode(packed, kind, dim, dtype), fake_quant(x))


@pytest.mark.parametrize(("fast", "quantize", "fake_quant", "kind", "dim"), KINDS)
def test_non_finite_rows_and_bfloat16_take_the_oracle(fast, quantize, fake_quant, kind, dim):
    x = torch.randn(3, 2, dim, generator=torch.Generator().manual_seed(1))
    x[1, 0, 5], x[2, 1, 0] = float("nan"), float("inf")
    fake, packed = fast(x)
    assert packed.shape == (3, 2, packed.shape[-1])
    assert torch.equal(fake.isnan(), fake_quant(x).isnan())
    assert same_bits(fake.nan_to_num(), fake_quant(x).nan_to_num())
    codes, scales = quantize(x)
    assert same_bits(packed, torch.cat([codes.view(torch.uint8), scales.view(torch.uint8)], -1))
    x16 = x.nan_to_num().bfloat16()
    assert same_bits(fast(x16)[0], fake_quant(x16))
    assert same_bits(
        quant.decode(fast(x16)[1].view(6, -1), kind, dim, torch.bfloat16), fake_quant(x16).view(6, -1)
    )
