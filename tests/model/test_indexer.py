import math

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from sglang_ds41.model.indexer import (
    Indexer,
    candidate_blocks,
    mask_invisible,
    restrict_to_blocks,
    select_topk,
    visible_counts,
)
from sglang_ds41.model.rope import RotaryEmbedding

from ._tiny import tiny_config

INF = float("inf")


def test_visibility_counts_follow_completed_groups():
    positions = torch.arange(6)
    assert visible_counts(positions, 2).tolist() == [0, 1, 1, 2, 2, 3]
    assert visible_counts(positions, 1).tolist() == [1, 2, 3, 4, 5, 6]  # own entry visible


def test_scores_are_weighted_sums_of_relu_dot_products():
    cfg = tiny_config()
    indexer = Indexer(cfg, RotaryEmbedding.for_layer(cfg, 1), owns_keys=False).to(torch.float64)
    q = torch.zeros(2, 32, dtype=torch.float64)
    q[0, :3] = torch.tensor([1.0, 2.0, -1.0])  # FP4-exact (scale 1 after the 2**ceil rule)
    q[1, :3] = torch.tensor([-4.0, 0.5, 6.0])
    with torch.no_grad():
        indexer.wq_b.weight.zero_()
        indexer.wq_b.weight[:, 0] = q.flatten()
        indexer.weights_proj.weight.zero_()
        indexer.weights_proj.weight[:, 0] = torch.tensor([2.0, -3.0])
    x = torch.zeros(1, cfg.hidden_size, dtype=torch.float64)
    x[0, 0] = 1.0
    q_lora = torch.zeros(1, cfg.q_lora_rank, dtype=torch.float64)
    q_lora[0, 0] = 1.0
    keys = torch.zeros(2, 32, dtype=torch.float64)
    keys[0, :3] = torch.tensor([1.0, 1.0, 1.0])  # q0.k = 2, q1.k = 2.5
    keys[1, :3] = torch.tensor([0.0, 0.0, 1.0])  # q0.k = -1 (relu 0), q1.k = 6
    scores = indexer.scores(x, q_lora, torch.tensor([0]), keys)  # position 0: RoPE is the identity
    norm = 1 / math.sqrt(32 * 2)
    expected = [(2 * 2 - 3 * 2.5) * norm, (2 * 0 - 3 * 6) * norm]
    assert torch.allclose(scores, torch.tensor([expected], dtype=torch.float64), rtol=1e-14, atol=0)


def test_select_topk_takes_largest_finite_and_pads_with_minus_one():
    scores = torch.tensor([[0.1, 3.0, -INF, 2.0], [-INF, 5.0, -INF, -INF]])
    picked = select_topk(scores, 3)
    assert sorted(picked[0].tolist()) == [0, 1, 3]
    assert sorted(picked[1].tolist()) == [-1, -1, 1]


def test_select_topk_breaks_ties_towards_the_lower_index():
    scores = torch.tensor([[0.0, 1.0, 0.0, 0.0, 0.0]])
    assert select_topk(scores, 3).tolist() == [[1, 0, 2]]


def test_candidate_blocks_force_the_newest_block_and_drop_invisible_ones():
    # 10 entries in blocks of 4: [0..3], [4..7], [8, 9]; query sees 9 entries (0..8).
    scores = torch.tensor([[5.0, 1.0, 1.0, 1.0, 9.0, 0.0, 0.0, 0.0, -7.0, 100.0]])
    masked = mask_invisible(scores, torch.tensor([9]))
    blocks = candidate_blocks(masked, torch.tensor([9]), block_size=4, n_blocks=2)
    assert blocks.tolist() == [[False, True, True]]  # block 2 forced (entry 8), then block 1 (max 9)
    restricted = restrict_to_blocks(masked, blocks, 4)
    assert select_topk(restricted, 4)[0].tolist() == [4, 5, 6, 7]  # 9, then the 0-ties by index
    assert sorted(select_topk(restricted, 6)[0].tolist()) == [-1, 4, 5, 6, 7, 8]  # 0..3 excluded


def test_candidate_blocks_are_empty_before_any_entry_is_visible():
    masked = mask_invisible(torch.zeros(1, 4), torch.tensor([0]))
    assert not candidate_blocks(masked, torch.tensor([0]), block_size=2, n_blocks=2).any()
    none_yet = candidate_blocks(torch.zeros(1, 0), torch.tensor([0]), block_size=2, n_blocks=2)
    assert none_yet.shape == (1, 0)
    assert select_topk(restrict_to_blocks(torch.zeros(1, 0), none_yet, 2), 3).shape == (1, 0)


@settings(max_examples=60, deadline=None)
@given(
    start=st.integers(0, 40),
    length=st.integers(1, 12),
    ratio=st.sampled_from([1, 2]),
    k=st.integers(1, 6),
    block_size=st.integers(1, 4),
    n_blocks=st.integers(1, 3),
    seed=st.integers(0, 2**31 - 1),
)
def test_selection_never_includes_future_entries(start, length, ratio, k, block_size, n_blocks, seed):
    positions = torch.arange(start, start + length)
    n_entries = (start + length) // ratio
    gen = torch.Generator().manual_seed(seed)
    # Coarse values make ties frequent; they must never let an invisible entry in.
    scores = torch.randint(-2, 3, (length, n_entries), generator=gen).double()
    n_visible = visible_counts(positions, ratio)
    masked = mask_invisible(scores, n_visible)
    blocks = candidate_blocks(masked, n_visible, block_size, n_blocks)
    for restricted in (masked, restrict_to_blocks(masked, blocks, block_size)):
        picked = select_topk(restricted, k)
        for row, n in zip(picked.tolist(), n_visible.tolist(), strict=True):
            chosen = [g for g in row if g >= 0]
            assert all(g < n for g in chosen)
            assert len(set(chosen)) == len(chosen)
    # Without candidates every visible entry competes: exactly min(k, n_t) picks.
    picked = select_topk(masked, k)
    assert ((picked >= 0).sum(dim=1) == n_visible.clamp(max=k)).all()
    # Kept blocks hold at least one visible entry; the newest entry's block is always kept.
    first_entry = torch.arange(blocks.shape[1]) * block_size
    assert not (blocks & (first_entry[None, :] >= n_visible[:, None])).any()
    for row, n in zip(blocks.tolist(), n_visible.tolist(), strict=True):
        assert n == 0 or row[(n - 1) // block_size]
