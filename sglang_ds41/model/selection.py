"""The indexer's selection (MODEL.md §4.5) over bounded column blocks, with a running top-k.

`indexer.py` defines the selection on a whole score matrix `[T, N]`: mask the invisible
entries, publish / apply the candidate blocks, take the stable top-k. Scoring every query
against every entry at once costs `[T, heads, N]` floats, which grows with chunk x context.
`select_rows` computes the same selection from scores delivered a block of columns at a time
(entry ids ascending), so memory is bounded by one block:

* a running top-k keeps each row's k best (value, entry id) so far, ties to the lower entry id;
  since every block's ids are above the ones already kept, merging block after block gives
  exactly `indexer.stable_topk` of the whole row (values, ids and their order);
* candidate blocks (the candidate source) are scored per block of `size` entries, blocks never
  straddle a column block, and a second running top-k over block ids picks the kept ones;
* consumers receive the kept block ids (not a dense mask: that would be [T, N / size]) and
  test each entry's block for membership.

Scores of entries a row may not see are -inf, as in the dense form; columns no row of the call
sees are never scored.

What an index source publishes is `scan_rows`: that selection, with every row that sees at most
k entries taking all of them in id order (`every_entry`), whatever the scores; the attention
sums over the set, so only the rounding depends on the order, and this way it does not depend
on which rows were scored together.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F

INF = float("inf")


class RunningTopK:
    """Each row's k largest values pushed so far, ties going to the lower id."""

    def __init__(self, rows: int, k: int, dtype: torch.dtype, device=None):
        self.k = k
        self.values = torch.empty(rows, 0, dtype=dtype, device=device)
        self.ids = torch.empty(rows, 0, dtype=torch.int64, device=device)

    def push(self, values: torch.Tensor, ids: torch.Tensor) -> None:
        """values [R, c] of ids [c] (ascending, above every id pushed before)."""
        merged = torch.cat([self.values, values], dim=1)  # kept first: lower ids
        merged_ids = torch.cat([self.ids, ids.expand(values.shape[0], -1)], dim=1)
        m = min(self.k, merged.shape[1])
        if m == 0:
            return
        if m == merged.shape[1]:  # everything is kept: only the order (value desc, id asc) is new
            order = merged.sort(dim=1, descending=True, stable=True).indices
            self.values, self.ids = merged.gather(1, order), merged_ids.gather(1, order)
            return
        # The m-th largest value bounds the pick: everything above it, then its ties by merged
        # column, which is ascending id among equal values (kept rows are sorted by (value
        # desc, id asc), block columns come after them with higher ids).
        kth = merged.topk(m, dim=1).values[:, -1:]
        above = merged > kth
        tied = merged == kth
        keep = above | (tied & (tied.cumsum(dim=1) <= m - above.sum(dim=1, keepdim=True)))
        values, ids = merged[keep].view(-1, m), merged_ids[keep].view(-1, m)
        order = values.sort(dim=1, descending=True, stable=True).indices
        self.values, self.ids = values.gather(1, order), ids.gather(1, order)

    def picked(self, width: int) -> torch.Tensor:
        """ids [R, width] of the finite values kept, best first; -1 fills the rest."""
        ids = self.ids.masked_fill(self.values == -INF, -1)
        return F.pad(ids, (0, width - ids.shape[1]), value=-1)


@dataclass(frozen=True)
class Candidates:
    """The candidate source's rule: blocks of `size` entries, the `keep` best kept."""

    size: int
    keep: int


def block_scores(
    scores: torch.Tensor, first: int, n_visible: torch.Tensor, size: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Masked scores [R, c] of entries first.. (first a multiple of size) -> (block scores [R, nb],
    block ids [nb]): a block scores its best entry; the block of each row's newest visible entry
    is forced in (+inf), as in `indexer.candidate_blocks`."""
    rows, c = scores.shape
    n = -(-c // size)
    padded = F.pad(scores, (0, n * size - c), value=-INF)
    best = padded.view(rows, n, size).amax(dim=-1)  # [R, nb]
    ids = first // size + torch.arange(n, device=scores.device)
    newest = torch.div(n_visible - 1, size, rounding_mode="floor")
    forced = (ids[None, :] == newest[:, None]) & (n_visible > 0)[:, None]
    return best.masked_fill(forced, INF), ids


def in_blocks(kept_sorted: torch.Tensor, entries: torch.Tensor, size: int) -> torch.Tensor:
    """bool [R, c]: whether each entry of `entries` [c] lies in one of the row's kept blocks
    (`kept_sorted` [R, keep], ascending block ids, -1 = none)."""
    blocks = torch.div(entries, size, rounding_mode="floor").expand(kept_sorted.shape[0], -1).contiguous()
    if kept_sorted.shape[1] == 0:
        return torch.zeros_like(blocks, dtype=torch.bool)
    at = torch.searchsorted(kept_sorted, blocks).clamp(max=kept_sorted.shape[1] - 1)
    return kept_sorted.gather(1, at) == blocks


def picks_every_entry(n_visible: torch.Tensor, k: int, publish: Candidates | None = None) -> bool:
    """Whether every row sees at most k entries (and, with `publish`, at most `publish.keep`
    blocks of them): then the selection is every visible entry whatever the scores, and
    `every_entry` gives it without scoring (a context under k x ratio tokens: every prefill
    and decode step of a short conversation)."""
    most = int(n_visible.max()) if n_visible.numel() else 0
    return most <= k and (publish is None or _blocks(most, publish) <= publish.keep)


def every_entry(
    n_visible: torch.Tensor,
    first: torch.Tensor,
    width: int,
    publish: Candidates | None = None,
    allowed: tuple[torch.Tensor, int] | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The selection of rows that pick every entry they see: those entries (inside the row's
    `allowed` blocks) in id order, offset by `first` [R], -1 after them; with `publish`, every
    block holding a visible entry, in id order. The scan picks the same sets ordered by score;
    the attention sums over the set, so the order only moves its rounding, and
    `small_rows_in_id_order` makes it the same however the rows are batched."""
    entries = torch.arange(width, device=n_visible.device)
    take = entries[None, :] < n_visible[:, None]  # [R, width]
    if allowed is not None:
        take &= in_blocks(allowed[0].sort(dim=1).values, entries, allowed[1])
        order = (~take).to(torch.int8).argsort(dim=1, stable=True)  # the taken ones first
        take, ids = take.gather(1, order), entries[order]
    else:
        ids = entries.expand_as(take)
    picked = torch.where(take, ids + first[:, None], -1)
    if publish is None:
        return picked, None
    blocks = torch.arange(publish.keep, device=n_visible.device)
    return picked, torch.where(blocks[None, :] < _blocks(n_visible, publish)[:, None], blocks, -1)


def small_rows_in_id_order(
    picked: torch.Tensor,
    kept: torch.Tensor | None,
    n_visible: torch.Tensor,
    first: torch.Tensor,
    k: int,
    publish: Candidates | None = None,
    allowed: tuple[torch.Tensor, int] | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """A scan's selection (`picked` offset by `first`, `kept`) with the rows that see at most k
    entries put in `every_entry`'s order, and the kept blocks of the rows that see at most
    `publish.keep` blocks in block order: a row's picks and blocks then do not depend on whether
    its forward scored (some row saw more) or not, nor on which rows were scanned with it."""
    small = n_visible <= k
    if publish is not None:
        small_blocks = _blocks(n_visible, publish) <= publish.keep
        small = small | small_blocks
    rows = small.nonzero().flatten()
    if not rows.numel():
        return picked, kept
    within = None if allowed is None else (allowed[0][rows], allowed[1])
    every, every_kept = every_entry(n_visible[rows], first[rows], picked.shape[1], publish, within)
    picked = picked.clone()
    picked[rows] = torch.where((n_visible[rows] <= k)[:, None], every, picked[rows])
    if publish is not None:
        kept = kept.clone()
        kept[rows] = torch.where(small_blocks[rows, None], every_kept, kept[rows])
    return picked, kept


def scan_rows(
    score: Callable[[int, int], torch.Tensor],
    n_visible: torch.Tensor,
    k: int,
    width: int,
    column_block: int,
    publish: Candidates | None = None,
    allowed: tuple[torch.Tensor, int] | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The selection an index source publishes for R query rows: `select_rows`, with the rows
    that see at most k entries (at most `publish.keep` blocks) in `every_entry`'s order
    (`small_rows_in_id_order`), so a row's picks do not depend on which rows were scored with it.
    The compiled scan (`fast.selection.select_block`) gives the same in one pass."""
    picked, kept = select_rows(score, n_visible, k, width, column_block, publish, allowed)
    return small_rows_in_id_order(picked, kept, n_visible, torch.zeros_like(n_visible), k, publish, allowed)


def _blocks(n_visible, publish: Candidates):
    """How many candidate blocks hold the visible entries."""
    return -(-n_visible // publish.size)


def select_rows(
    score: Callable[[int, int], torch.Tensor],
    n_visible: torch.Tensor,
    k: int,
    width: int,
    column_block: int,
    publish: Candidates | None = None,
    allowed: tuple[torch.Tensor, int] | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The selection of R query rows: `score(c0, c1)` -> unmasked scores [R, c1 - c0] of entries
    c0..c1-1; row r sees entries < n_visible[r].

    Returns (entry ids [R, width]: the min(k, #finite) best finite scores, -1 after them, and,
    with `publish`, the kept candidate block ids [R, publish.keep], -1 = none). `allowed` =
    (kept block ids [R, keep], their size): a consumer's restriction to the candidate blocks.
    `column_block` must be a multiple of publish.size."""
    rows = n_visible.shape[0]
    top = blocks_top = kept_sorted = None
    n_cols = int(n_visible.max()) if rows else 0
    for c0 in range(0, n_cols, column_block):
        c1 = min(c0 + column_block, n_cols)
        entries = torch.arange(c0, c1, device=n_visible.device)
        s = score(c0, c1).masked_fill(entries[None, :] >= n_visible[:, None], -INF)
        if top is None:
            top = RunningTopK(rows, k, s.dtype, s.device)
            if publish is not None:
                blocks_top = RunningTopK(rows, publish.keep, s.dtype, s.device)
            if allowed is not None:
                kept_sorted = allowed[0].sort(dim=1).values
        if blocks_top is not None:
            blocks_top.push(*block_scores(s, c0, n_visible, publish.size))
        if kept_sorted is not None:
            s = s.masked_fill(~in_blocks(kept_sorted, entries, allowed[1]), -INF)
        top.push(s, entries)
    none = torch.full((rows, width), -1, dtype=torch.int64, device=n_visible.device)
    picked = none if top is None else top.picked(width)
    if publish is None:
        return picked, None
    kept = none[:, :0] if blocks_top is None else blocks_top.picked(publish.keep)
    return picked, F.pad(kept, (0, publish.keep - kept.shape[1]), value=-1)
