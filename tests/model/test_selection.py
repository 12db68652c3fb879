"""The blocked selection (`model/selection.py`) against the dense definition (`model/indexer.py`).

The dense form scores a whole `[T, N]` row at once; the blocked one sees blocks of columns and
keeps a running top-k. They must pick the same entries in the same order, ties to the lower
entry id, publish the same candidate blocks and restrict consumers the same way, for every
column-block width. Coarse integer scores make ties (and -inf) everywhere.
"""

from __future__ import annotations

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from sglang_ds41.model.indexer import (
    candidate_blocks,
    mask_invisible,
    restrict_to_blocks,
    select_topk,
    stable_topk,
    visible_counts,
)
from sglang_ds41.model.selection import (
    Candidates,
    RunningTopK,
    every_entry,
    picks_every_entry,
    scan_rows,
    select_rows,
)

INF = float("inf")


def blocks_as_mask(kept: torch.Tensor, n_blocks: int) -> torch.Tensor:
    """Kept block ids [R, keep] (-1 = none) -> bool [R, n_blocks], the dense form's mask."""
    mask = torch.zeros(kept.shape[0], n_blocks + 1, dtype=torch.bool)
    return mask.scatter(1, kept + 1, True)[:, 1:]


def dense(scores, n_visible, k, size, keep, allowed=None):
    masked = mask_invisible(scores, n_visible)
    blocks = candidate_blocks(masked, n_visible, size, keep)
    if allowed is not None:
        masked = restrict_to_blocks(masked, allowed, size)
    return select_topk(masked, k), blocks


def blocked(scores, n_visible, k, size, keep, column_block, allowed=None):
    restrict = None
    if allowed is not None:  # the mask as kept ids, as the candidate source publishes them
        ids = [torch.nonzero(row).flatten() for row in allowed]
        kept = torch.full((scores.shape[0], keep), -1, dtype=torch.int64)
        for r, row in enumerate(ids):
            kept[r, : row.numel()] = row
        restrict = (kept, size)
    width = min(k, scores.shape[1])
    return select_rows(
        lambda c0, c1: scores[:, c0:c1], n_visible, k, width, column_block, Candidates(size, keep), restrict
    )


@settings(max_examples=150, deadline=None)
@given(
    start=st.integers(0, 30),
    length=st.integers(1, 12),
    ratio=st.sampled_from([1, 2]),
    k=st.integers(1, 6),
    size=st.integers(1, 4),
    keep=st.integers(1, 3),
    blocks_per_column_block=st.integers(1, 5),
    seed=st.integers(0, 2**31 - 1),
)
def test_blocked_selection_equals_the_dense_one(
    start, length, ratio, k, size, keep, blocks_per_column_block, seed
):
    positions = torch.arange(start, start + length)
    n_entries = (start + length) // ratio
    n_visible = visible_counts(positions, ratio)
    gen = torch.Generator().manual_seed(seed)
    scores = torch.randint(-2, 3, (length, n_entries), generator=gen).double()
    column_block = size * blocks_per_column_block
    want, want_blocks = dense(scores, n_visible, k, size, keep)
    got, got_blocks = blocked(scores, n_visible, k, size, keep, column_block)
    assert torch.equal(got, want)  # same entries, same order
    n_blocks = -(-n_entries // size)
    assert torch.equal(blocks_as_mask(got_blocks, n_blocks), want_blocks)
    # a consumer restricted to those blocks (any mask of at most `keep` blocks works the same)
    want, _ = dense(scores, n_visible, k, size, keep, allowed=want_blocks)
    got, _ = blocked(scores, n_visible, k, size, keep, column_block, allowed=want_blocks)
    assert torch.equal(got, want)


def test_ties_go_to_the_lower_entry_across_blocks():
    scores = torch.tensor([[0.0, 1.0, 0.0, 0.0, 0.0, 1.0, 0.0, 0.0]])
    n_visible = torch.tensor([8])
    for column_block in (1, 2, 3, 8):
        got, _ = blocked(scores, n_visible, 3, 1, 1, column_block)
        assert got.tolist() == [[1, 5, 0]], column_block


@settings(max_examples=80, deadline=None)
@given(
    rows=st.integers(1, 5),
    n=st.integers(0, 30),
    k=st.integers(1, 8),
    cut=st.lists(st.integers(1, 7), min_size=1, max_size=8),
    seed=st.integers(0, 2**31 - 1),
)
def test_running_topk_is_stable_topk_of_the_whole_row(rows, n, k, cut, seed):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randint(-3, 3, (rows, n), generator=gen).float()
    x[x == -3] = -INF
    top, c0, i = RunningTopK(rows, k, x.dtype), 0, 0
    while c0 < n:
        c1 = min(n, c0 + cut[i % len(cut)])
        top.push(x[:, c0:c1], torch.arange(c0, c1))
        c0, i = c1, i + 1
    values, ids = stable_topk(x, k)
    assert torch.equal(top.values, values) and torch.equal(top.ids, ids)


def test_no_visible_entry_selects_nothing():
    got, kept = select_rows(
        lambda c0, c1: torch.zeros(2, c1 - c0), torch.tensor([0, 0]), 3, 2, 4, Candidates(2, 2)
    )
    assert got.tolist() == [[-1, -1]] * 2 and kept.tolist() == [[-1, -1]] * 2


@settings(max_examples=150, deadline=None)
@given(
    rows=st.integers(1, 5),
    k=st.integers(1, 12),
    size=st.integers(1, 4),
    keep=st.integers(1, 6),
    restricted=st.booleans(),
    seed=st.integers(0, 2**31 - 1),
)
def test_every_entry_is_the_scans_set_where_rows_see_at_most_k(rows, k, size, keep, restricted, seed):
    """Rows that see at most k entries (and at most `keep` blocks): `every_entry` picks the sets
    the scan picks, in id order, offset by `first`, and keeps every visible block."""
    gen = torch.Generator().manual_seed(seed)
    n_visible = torch.randint(0, min(k, keep * size) + 1, (rows,), generator=gen)
    assert picks_every_entry(n_visible, k, Candidates(size, keep))
    cols = max(int(n_visible.max()), 1)
    scores = torch.randint(-2, 3, (rows, cols), generator=gen).double()
    first = torch.randint(0, 50, (rows,), generator=gen)
    allowed = None
    if restricted:  # kept block ids of a candidate source, -1 = none
        allowed = (torch.randint(-1, -(-cols // size), (rows, 2), generator=gen), size)
    width = min(k, cols)
    want, want_kept = select_rows(
        lambda c0, c1: scores[:, c0:c1], n_visible, k, width, cols, Candidates(size, keep), allowed
    )
    got, kept = every_entry(n_visible, first, width, Candidates(size, keep), allowed)
    for r in range(rows):
        mine = got[r][got[r] >= 0]
        assert torch.equal(mine, torch.sort(want[r][want[r] >= 0]).values + first[r]), r
        assert (got[r][mine.numel() :] == -1).all()
        assert sorted(kept[r][kept[r] >= 0].tolist()) == sorted(want_kept[r][want_kept[r] >= 0].tolist())


@settings(max_examples=80, deadline=None)
@given(
    rows=st.integers(1, 6),
    k=st.integers(1, 10),
    size=st.integers(1, 4),
    keep=st.integers(1, 3),
    restricted=st.booleans(),
    seed=st.integers(0, 2**31 - 1),
)
def test_the_scan_gives_each_small_row_alone_its_every_entry_selection(rows, k, size, keep, restricted, seed):
    """`scan_rows`: a row that sees more than k entries (more than `keep` blocks) keeps the
    running top-k's picks (blocks); any other row gets `every_entry` of that row alone, so its
    picks do not depend on the rows scanned with it."""
    gen = torch.Generator().manual_seed(seed)
    n_visible = torch.randint(0, 2 * max(k, keep * size) + 1, (rows,), generator=gen)
    cols = max(int(n_visible.max()), 1)
    scores = torch.randint(-2, 3, (rows, cols), generator=gen).double()
    allowed = None
    if restricted:
        allowed = (torch.randint(-1, -(-cols // size), (rows, 2), generator=gen), size)
    width, publish = min(k, cols), Candidates(size, keep)
    score = lambda c0, c1: scores[:, c0:c1]  # noqa: E731
    got, kept = scan_rows(score, n_visible, k, width, cols, publish, allowed)
    scanned, scanned_kept = select_rows(score, n_visible, k, width, cols, publish, allowed)
    for r in range(rows):
        alone = None if allowed is None else (allowed[0][r : r + 1], size)
        zero = torch.zeros(1, dtype=torch.int64)
        every, every_kept = every_entry(n_visible[r : r + 1], zero, width, publish, alone)
        assert torch.equal(got[r], every[0] if n_visible[r] <= k else scanned[r]), r
        small_blocks = -(-int(n_visible[r]) // size) <= keep
        assert torch.equal(kept[r], every_kept[0] if small_blocks else scanned_kept[r]), r


def test_a_row_past_k_entries_needs_its_scores():
    assert not picks_every_entry(torch.tensor([3, 5]), 4)
    assert not picks_every_entry(torch.tensor([4, 4]), 4, Candidates(1, 3))  # 4 blocks > 3 kept
    assert picks_every_entry(torch.tensor([4, 0]), 4, Candidates(2, 2))
