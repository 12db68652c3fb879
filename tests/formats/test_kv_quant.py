import pytest
import torch

from sglang_ds41.formats import kv_quant
from sglang_ds41.formats.checks import FormatError


def _blocks(size: int, *blocks: list[float]) -> torch.Tensor:
    return torch.cat([torch.tensor(b + [0.0] * (size - len(b))) for b in blocks]).reshape(1, -1)


def test_window_fp8_hand_computed_blocks():
    # amax 1 -> s = 2**ceil(log2(1/448)) = 2**-8; x*256 = 256, 76.8 -> 80, -2.56 -> -2.5.
    # amax 1e-6 is below the 1e-4 floor -> s = 2**ceil(log2(1e-4/448)) = 2**-22; 4.19 -> 4.
    # zero block: floor applies too -> 2**-22, values stay zero.
    x = _blocks(32, [1.0, 0.3, -0.01], [1e-6], [])
    _, scales = kv_quant.quantize_window_fp8(x)
    assert scales.view(torch.uint8).tolist() == [[119, 105, 105]]
    out = kv_quant.fake_quant_window_fp8(x)[0]
    assert out[:3].tolist() == [1.0, 0.3125, -0.009765625]
    assert out[32].item() == 4 * 2.0**-22
    assert out[64:].eq(0).all()


def test_latent_fp4_hand_computed_blocks():
    # s = e4m3(clamp(amax/6, 2**-9, 448)):
    # amax 3    -> s = 0.5 (0x30):  3 -> 6, 1.25 -> 2.5 -> 2 (tie), -0.375 -> -0.75 -> -1 (tie), 0.1 -> 0
    # amax 1.3  -> 0.21667 -> E4M3 0.21875 (0x26): 1.3 -> 5.94 -> 6, 0.5 -> 2.29 -> 2
    # amax 1e-4 -> clamped to 2**-9 (0x01): 0.0512 -> 0
    # amax 3000 -> 500 clamped to 448 (0x7E): 6.7 saturates to 6
    # zero block -> 2**-9, stays zero
    x = _blocks(16, [3.0, 1.25, -0.375, 0.1], [1.3, 0.5], [1e-4], [3000.0, -100.0], [])
    packed, scales = kv_quant.quantize_latent_fp4(x)
    assert packed.shape == (1, 40) and scales.dtype == torch.float8_e4m3fn
    assert scales.view(torch.uint8).tolist() == [[0x30, 0x26, 0x01, 0x7E, 0x01]]
    out = kv_quant.fake_quant_latent_fp4(x)[0]
    assert out[:4].tolist() == [3.0, 1.0, -0.5, 0.0]
    assert out[16:18].tolist() == [1.3125, 0.4375]
    assert out[32].item() == 0.0
    assert out[48:50].tolist() == [2688.0, 0.0]
    assert out[64:].eq(0).all()


def test_index_fp4_hand_computed_blocks():
    # s = 2**ceil(log2(max(amax, 6 * 2**-126) / 6)):
    # amax 3    -> 2**-1 (byte 126): 3, 1.25 -> 1, -0.375 -> -0.5, 0.1 -> 0
    # amax 1.3  -> 2**-2 (125): 5.2 -> 6 -> 1.5, 0.5 -> 0.5, 1.2 -> 1 -> 0.25
    # amax 1e-4 -> 2**-15 (112): 3.28 -> 3
    # zero      -> 2**-126 (byte 1)
    x = _blocks(32, [3.0, 1.25, -0.375, 0.1], [1.3, 0.5, 0.3], [1e-4], [])
    packed, scales = kv_quant.quantize_index_fp4(x)
    assert packed.shape == (1, 64) and scales.dtype == torch.float8_e8m0fnu
    assert scales.view(torch.uint8).tolist() == [[126, 125, 112, 1]]
    out = kv_quant.fake_quant_index_fp4(x)[0]
    assert out[:4].tolist() == [3.0, 1.0, -0.5, 0.0]
    assert out[32:35].tolist() == [1.5, 0.5, 0.25]
    assert out[64].item() == 3 * 2.0**-15
    assert out[96:].eq(0).all()


def test_model_shapes_keep_dtype_and_byte_budgets():
    g = torch.Generator().manual_seed(0)
    kv = torch.randn(5, 512, generator=g).to(torch.bfloat16)
    key = torch.randn(5, 128, generator=g).to(torch.bfloat16)
    for fake in (kv_quant.fake_quant_window_fp8, kv_quant.fake_quant_latent_fp4):
        out = fake(kv)
        assert out.dtype == torch.bfloat16 and out.shape == kv.shape
    assert kv_quant.fake_quant_index_fp4(key).dtype == torch.bfloat16
    v, s = kv_quant.quantize_window_fp8(kv)
    assert v.shape[-1] + s.shape[-1] == 528  # MODEL.md §4.6: 512 E4M3 + 16 UE8M0
    p, s = kv_quant.quantize_latent_fp4(kv)
    assert p.shape[-1] + s.shape[-1] == 288  # 256 B E2M1 + 32 B E4M3
    p, s = kv_quant.quantize_index_fp4(key)
    assert p.shape[-1] + s.shape[-1] == 68  # 64 B E2M1 + 4 B UE8M0


@pytest.mark.parametrize("fake", [kv_quant.fake_quant_window_fp8, kv_quant.fake_quant_index_fp4])
def test_power_of_two_fake_quants_are_idempotent(fake):
    g = torch.Generator().manual_seed(1)
    x = torch.randn(64, 512, generator=g) * torch.logspace(-3, 3, 64).reshape(64, 1)
    once = fake(x)
    assert torch.equal(fake(once), once)


def test_wrong_widths_raise_clear_errors():
    with pytest.raises(FormatError, match="fp4 latent: last dim 24 is not a multiple of 16"):
        kv_quant.quantize_latent_fp4(torch.zeros(1, 24))
    with pytest.raises(FormatError, match="fp4 index: last dim 48 is not a multiple of 32"):
        kv_quant.quantize_index_fp4(torch.zeros(1, 48))
    with pytest.raises(FormatError, match="fp8 rows: last dim 48 is not a multiple of 32"):
        kv_quant.quantize_window_fp8(torch.zeros(1, 48))
