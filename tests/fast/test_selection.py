"""The compiled selection of one block of scores (`fast.selection.select_block`) against the
oracle's scan (`model.selection.select_rows`), on scores full of ties and masked entries, with
candidate blocks published and applied, and the oracle scanning in several column blocks."""

from __future__ import annotations

import pytest
import torch

from sglang_ds41.fast.selection import select_block
from sglang_ds41.model.selection import Candidates, select_rows


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
        want, want_kept = select_rows(
            lambda c0, c1, s=scores: s[:, c0:c1], n_visible, k, min(k, cols), column_block, publish, allowed
        )
        got, kept = select_block(scores, n_visible, first, k, min(k, cols), publish, allowed)
        assert torch.equal(got, torch.where(want >= 0, want + first[:, None], -1)), trial
        if publish is not None:
            assert torch.equal(kept, want_kept), trial
