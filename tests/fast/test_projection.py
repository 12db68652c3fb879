"""A decode step's query and window-key projections as one loop, against the pieces they are
(`Attention.project`'s linears, norms and rotations), on the TINY layers and the trained shape."""

from __future__ import annotations

import pytest
import torch

from sglang_ds41.fast import attention as fast_attention
from sglang_ds41.fast import projection as fast
from sglang_ds41.model.attention import Attention
from sglang_ds41.model.batch import Chunks
from tests.model._tiny import randomize_, tiny_config

SHAPES = {"tiny": {}, "trained": {"hidden_size": 128, "q_lora_rank": 64, "head_dim": 64}}


def layer(dtype: torch.dtype, shape: str = "tiny", number: int = 2) -> Attention:
    attn = randomize_(Attention(tiny_config(**SHAPES[shape]), number), seed=number)
    return attn.to(dtype).requires_grad_(False)


def pieces(attn: Attention, x: torch.Tensor, positions: torch.Tensor):
    q_lora = attn.q_norm(attn.wq_a(x))
    q = attn.rope(attn.wq_b(q_lora).unflatten(-1, (attn.n_heads, attn.head_dim)), positions)
    return q_lora, q, attn.rope(attn.kv_norm(attn.wkv(x)), positions)


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("tokens", [1, 5, fast.LOOP_TOKENS])
def test_the_loop_gives_the_pieces_values(shape, dtype, tokens):
    attn = layer(dtype, shape)
    gen = torch.Generator().manual_seed(tokens)
    x = torch.randn(tokens, attn.wq_a.in_features, generator=gen, dtype=dtype)
    positions = torch.randint(0, 5000, (tokens,), generator=gen)  # past the first table: it grows
    got = fast.project_rows(attn, x, positions)
    assert got is not None
    tolerance = 1e-5 if dtype == torch.float32 else 1e-13
    for a, b in zip(got, pieces(attn, x, positions), strict=True):
        assert a.dtype == dtype and a.shape == b.shape
        assert float((a - b).abs().max() / b.abs().max()) < tolerance


def test_a_tokens_rows_are_the_same_bits_alone_as_in_its_batch():
    attn = layer(torch.float32)
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(9, attn.wq_a.in_features, generator=gen)
    positions = torch.arange(100, 109)
    batch = fast.project_rows(attn, x, positions)
    for t in range(9):
        alone = fast.project_rows(attn, x[t : t + 1], positions[t : t + 1])
        for a, b in zip(alone, batch, strict=True):
            assert torch.equal(a[0], b[t]), t


def test_the_phase_takes_the_loop_up_to_its_bound_and_the_gemms_past_it(monkeypatch):
    attn = layer(torch.float32)
    taken = []
    loop = fast._project
    monkeypatch.setattr(fast, "_project", lambda *a: taken.append(a[0].shape[0]) or loop(*a))
    for tokens in (1, fast.LOOP_TOKENS, fast.LOOP_TOKENS + 1):
        x = torch.randn(tokens, attn.wq_a.in_features)
        projected = fast_attention.project(attn, x, Chunks.of([0], [tokens]))
        want = pieces(attn, x, torch.arange(tokens))
        assert float((projected.q - want[1]).abs().max() / want[1].abs().max()) < 1e-5
    assert taken == [1, fast.LOOP_TOKENS]


def test_a_weight_changed_in_place_is_seen():
    attn = layer(torch.float32)
    x, positions = torch.randn(2, attn.wq_a.in_features), torch.tensor([3, 4])
    fast.project_rows(attn, x, positions)
    attn.wkv.weight.mul_(2)
    attn.q_norm.weight.add_(1)
    got = fast.project_rows(attn, x, positions)
    for a, b in zip(got, pieces(attn, x, positions), strict=True):
        assert float((a - b).abs().max() / b.abs().max()) < 1e-5


def test_linears_in_another_dtype_take_the_pieces():
    attn = layer(torch.float64)
    assert fast.project_rows(attn, torch.randn(1, attn.wq_a.in_features), torch.tensor([0])) is None
