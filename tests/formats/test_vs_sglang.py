"""V4.1's FP4 KV fake-quantisers against SGLang 0.5.23's pure-torch ones
(`sglang.kernels.ops.quantization.fp4_fake_quant`), an independent implementation of MODEL.md
§4.4 (compressed latents: E2M1, E4M3 scale per 16) and §4.5 (index keys: E2M1, power-of-two
scale per 32): bit-equal on random blocks across 2**-140 .. 2**12, all-zero blocks, and values
placed exactly on the E2M1 rounding ties."""

from __future__ import annotations

import pytest
import torch

from sglang_ds41.formats.kv_quant import fake_quant_index_fp4, fake_quant_latent_fp4


@pytest.fixture(scope="module")
def upstream():
    return pytest.importorskip("sglang.kernels.ops.quantization.fp4_fake_quant")


def blocks(block: int, dtype: torch.dtype) -> torch.Tensor:
    generator = torch.Generator().manual_seed(block)
    n = 4096
    magnitude = 2.0 ** torch.randint(-140, 13, (n, 1), generator=generator).float()
    x = torch.randn(n, block, generator=generator) * magnitude
    x[::17] = 0.0  # zero blocks stay zero
    # ties of the E2M1 grid (0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5 x scale) with amax pinning the scale
    ties = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, -0.25, -1.75, -5.0, 6.0])
    x[1::17, : ties.numel()] = ties * magnitude[1::17]
    x[1::17, ties.numel() :] = 0.0
    return x.to(dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_index_fp4_is_upstreams_bit_for_bit(upstream, dtype):
    x = blocks(32, dtype).reshape(-1, 128)
    assert torch.equal(fake_quant_index_fp4(x), upstream.fake_quant_fp4(x, 32))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_latent_fp4_is_upstreams_bit_for_bit(upstream, dtype):
    x = blocks(16, dtype).reshape(-1, 512)
    assert torch.equal(fake_quant_latent_fp4(x), upstream.fake_quant_compressed_kv(x))
