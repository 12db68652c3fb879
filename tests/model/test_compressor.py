import math

import pytest
import torch

from sglang_ds41.errors import Ds41Error
from sglang_ds41.model.compressor import Compressor

LN3 = math.log(3)


def pair_compressor() -> Compressor:
    """dim 4 -> latent 2: a_t = x_t[0:2], z_t = x_t[2:4]; unit norm weight."""
    comp = Compressor(dim=4, head_dim=2, ratio=2, eps=1e-20).to(torch.float64)
    with torch.no_grad():
        comp.wkv.weight.copy_(torch.eye(4, dtype=torch.float64)[:2])
        comp.wgate.weight.copy_(torch.eye(4, dtype=torch.float64)[2:])
    return comp


# Four tokens: rows are (a0, a1, z0, z1).
TOKENS = torch.tensor(
    [
        [1.0, 2.0, 0.0, LN3],
        [3.0, -2.0, 0.0, 0.0],
        [4.0, 1.0, LN3, 0.0],
        [0.0, 5.0, 0.0, 0.0],
    ],
    dtype=torch.float64,
)
# Pair 0: channel 0 equal gates -> (1 + 3) / 2 = 2; channel 1 weights 3:1 -> (3*2 - 2) / 4 = 1.
# Pair 1: channel 0 weights 3:1 -> (3*4 + 0) / 4 = 3; channel 1 equal -> (1 + 5) / 2 = 3.
# Then RMSNorm: [2, 1] / sqrt(5/2) and [3, 3] / 3.
EXPECTED = torch.tensor([[2 / math.sqrt(2.5), 1 / math.sqrt(2.5)], [1.0, 1.0]], dtype=torch.float64)


def test_ratio2_softmax_pooling_matches_hand_computation():
    latents, positions, pending = pair_compressor()(TOKENS, torch.arange(4), None)
    assert torch.allclose(latents, EXPECTED, rtol=1e-14, atol=0)
    assert positions.tolist() == [0, 2]  # an entry's position is its first token's
    assert pending is None


def test_ratio2_pending_token_carries_across_calls():
    comp = pair_compressor()
    first, _, pending = comp(TOKENS[:1], torch.arange(0, 1), None)
    assert first.shape[0] == 0 and pending is not None
    middle, pos_mid, pending = comp(TOKENS[1:3], torch.arange(1, 3), pending)
    last, pos_last, pending = comp(TOKENS[3:], torch.arange(3, 4), pending)
    assert torch.allclose(torch.cat([middle, last]), EXPECTED, rtol=1e-14, atol=0)
    assert pos_mid.tolist() == [0] and pos_last.tolist() == [2] and pending is None


def test_ratio2_rejects_chunks_that_lose_or_invent_the_pending_token():
    comp = pair_compressor()
    with pytest.raises(Ds41Error, match="odd position 1"):
        comp(TOKENS[1:3], torch.arange(1, 3), None)
    _, _, pending = comp(TOKENS[:1], torch.arange(0, 1), None)
    with pytest.raises(Ds41Error, match="even position 2"):
        comp(TOKENS[2:3], torch.arange(2, 3), pending)


def test_ratio1_emits_one_normed_latent_per_token():
    comp = Compressor(dim=4, head_dim=2, ratio=1, eps=1e-20).to(torch.float64)
    assert comp.wgate is None
    with torch.no_grad():
        comp.wkv.weight.copy_(torch.eye(4, dtype=torch.float64)[:2])
    latents, positions, pending = comp(TOKENS, torch.arange(5, 9), None)
    a = TOKENS[:, :2]
    assert torch.allclose(latents, a / a.square().mean(-1, keepdim=True).sqrt(), rtol=1e-14, atol=0)
    assert positions.tolist() == [5, 6, 7, 8] and pending is None
