"""The compiled selection of one block of scores (`fast.selection.select_block`) against the
oracle's scan (`model.selection.scan_rows`: the running top-k, then rows that see at most k
entries in id order), on scores full of ties and masked entries, with candidate blocks
published and applied, and the oracle scanning in several column blocks."""

from __future__ import annotations

import pytest
import torch

from sglang_ds41.fast.selection import select_block
from sglang_ds41.model.selection import Candidates, scan_rows


@pytest.mark.parametrize("seed", range(4))
def test_the_compiled_selection_equals_the_scan(seed):
    gen = torch.Generator().manual_seed(seed)

    def draw(lo: int, hi: int) -> int:
        return int(torch.randint(lo, hi, (1,), generator=gen))

    for trial in range(100):
        rows, cols = draw(1, 6), draw(0, 70)
        scores = torch.randint(-2, 3, (rows, cols), generator=gen).to(torch.float32)  # many ties
        n_visible = torch.randint(0, cols + 1, (rows,), generator=gen)
        first = torch.randint(0, 100, (rows,), generator=gen)
        k = draw(1, 20)
        publish = Candidates(4, draw(1, 6)) if trial % 2 else None
        allowed = None
        if trial % 3 == 0:  # kept block ids of a candidate source, -1 = none
            allowed = (torch.randint(-1, cols // 4 + 1, (rows, 3), generator=gen), 4)
        column_block = 8 if trial % 4 == 0 else 4096
        want, want_kept = scan_rows(
            lambda c0, c1, s=scores: s[:, c0:c1], n_visible, k, min(k, cols), column_block, publish, allowed
        )
        got, kept = select_block(scores, n_visible, first, k, min(k, cols), publish, allowed)
        assert torch.equal(got, torch.where(want >= 0, want + first[:, None], -1)), trial
        if publish is not None:
            assert torch.equal(kept, want_kept), trial


@pytest.mark.parametrize("rule", ["plain", "publish", "allowed"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("k", [17, 1024, 3000])
def test_long_rows_select_as_the_scan_does(dtype, k, rule):
    """Rows of thousands of entries (a long context's decode step, a long prefill): the
    compiled top-k (its radix sort of the buckets up to the k-th value; of 40 of ~600 candidate
    blocks too) against the scan, with ties everywhere, 0.0 next to -0.0 (equal: ties to the
    lower id), -inf and +inf, a row with k just under its entries, and a consumer's allowed
    blocks."""
    gen = torch.Generator().manual_seed(k)
    cols = 5000
    scores = (torch.randint(-40, 40, (4, cols), generator=gen) / 8).to(dtype)
    zeros = scores == 0
    signs = torch.randint(0, 2, (int(zeros.sum()),), generator=gen)
    scores[zeros] = torch.tensor([0.0, -0.0], dtype=dtype)[signs]
    scores[0, ::97], scores[1, ::89] = float("inf"), float("-inf")
    n_visible = torch.tensor([cols, cols - 7, 1500, k, k * 10 // 9])
    scores = torch.cat([scores, scores[:1]])
    first = torch.tensor([0, 5000, 10000, 15000, 20000])
    publish = Candidates(8, 40) if rule == "publish" else None
    allowed = None
    if rule == "allowed":  # 300 of the 625 blocks of 8 entries, -1 = none
        allowed = (torch.randint(-1, 625, (5, 300), generator=gen), 8)
    want, want_kept = scan_rows(lambda c0, c1: scores[:, c0:c1], n_visible, k, k, 4096, publish, allowed)
    got, kept = select_block(scores, n_visible, first, k, k, publish, allowed)
    assert torch.equal(got, torch.where(want >= 0, want + first[:, None], -1))
    if publish is not None:
        assert torch.equal(kept, want_kept)


def test_the_scan_selects_rows_longer_than_a_column_block_whole(monkeypatch):
    """Rows past one column block: the compiled scan joins the blocks' scores and selects the
    whole rows (counted), as the oracle's running top-k over the same blocks does."""
    from sglang_ds41.fast import selection

    calls = []
    original = selection.select_block
    monkeypatch.setattr(selection, "select_block", lambda *a: calls.append(1) or original(*a))
    gen = torch.Generator().manual_seed(3)
    scores = (torch.randint(-20, 20, (6, 700), generator=gen) / 4).float()
    n_visible = torch.tensor([700, 650, 300, 20, 0, 699])
    publish = Candidates(16, 5)
    for k, allowed in ((40, None), (100, (torch.randint(-1, 44, (6, 5), generator=gen), 16))):
        block = lambda c0, c1: scores[:, c0:c1]  # noqa: E731
        want, want_kept = scan_rows(block, n_visible, k, k, 64, publish, allowed)
        got, kept = selection.scan(block, n_visible, k, k, 64, publish, allowed)
        assert torch.equal(got, want) and torch.equal(kept, want_kept)
    assert len(calls) == 2
    monkeypatch.setattr(selection, "WHOLE_ROWS", 100)  # past it: the oracle's bounded scan
    got, kept = selection.scan(block, n_visible, 40, 40, 64, publish)
    want, want_kept = scan_rows(block, n_visible, 40, 40, 64, publish)
    assert torch.equal(got, want) and torch.equal(kept, want_kept) and len(calls) == 2
