"""The indexer's selection (`model.selection.select_rows`, MODEL.md §4.5) of scores delivered
in one block, as one compiled loop.

A decode step's rows see at most a few thousand entries each, so their scores fit one column
block and the running top-k of `select_rows` merges a single block: its ~30 small ops (mask,
block scores, candidate top-k, restriction, top-k, the tie-break of equal values) cost more than
the scores; a prefill block's rows fit one column block too up to ~4k entries, and there the
running top-k's sorts of [rows, entries] dominate. Here each row is masked, its candidate
blocks scored and picked, and its entries picked in one pass, with the oracle's rule: the
largest values first, ties to the lower id, -inf never picked.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch

from sglang_ds41.model.selection import Candidates, select_rows

from .jit import compiled, compiles, numpy_of

# Up to this many picks, insertion into a sorted run beats partition + sort.
SMALL_TOP = 16


@compiled
def _stable_top(values, m, out):
    """The ids of the min(m, n) largest of values [n], largest first, ties to the lower id,
    written to out[:min(m, n)]; returns how many."""
    n = values.shape[0]
    if m <= SMALL_TOP and m < n:  # insertion into the m best so far: no sort, no copy
        c = 0
        for i in range(n):
            v = values[i]
            if c == m and not v > values[out[m - 1]]:
                continue
            j = min(c, m - 1)
            while j > 0 and v > values[out[j - 1]]:  # after its equals: ties to the lower id
                out[j] = out[j - 1]
                j -= 1
            out[j] = i
            c = min(c + 1, m)
        return c
    if m >= n:
        order = np.argsort(-values, kind="mergesort")
        out[:n] = order
        return n
    kth = np.partition(values, n - m)[n - m]  # the m-th largest
    above = 0
    for i in range(n):
        if values[i] > kth:
            above += 1
    ties = m - above
    chosen = np.empty(m, np.int64)
    c = 0
    for i in range(n):
        v = values[i]
        if v > kth:
            chosen[c] = i
            c += 1
        elif v == kth and ties > 0:
            chosen[c] = i
            c += 1
            ties -= 1
    order = np.argsort(-values[chosen], kind="mergesort")  # chosen is in id order: stable
    for j in range(m):
        out[j] = chosen[order[j]]
    return m


@compiled
def _select(scores, n_visible, first, k, size, keep, allowed, allowed_size, picked, kept):
    """Each row r of scores [R, C]: entries >= n_visible[r] masked; with keep > 0 its best
    `keep` blocks of `size` entries (its newest visible block forced in) into kept [R, keep];
    with allowed [R, A] (allowed_size > 0) entries outside those blocks masked; its best k
    entries, offset by first[r], into picked [R, width]. -1 fills both."""
    rows, cols = scores.shape
    inf = np.inf
    n_blocks = -(-cols // size) if keep > 0 else 0
    masked = np.empty(cols, scores.dtype)
    block = np.empty(n_blocks, scores.dtype)
    ids = np.empty(max(cols, n_blocks), np.int64)
    picked[:] = -1
    kept[:] = -1
    for r in range(rows):
        nv = min(n_visible[r], cols)  # entries past it score -inf: never picked, never kept
        for c in range(nv):
            masked[c] = scores[r, c]
        if keep > 0:
            row_blocks = -(-nv // size)
            for b in range(row_blocks):
                best = -inf
                for c in range(b * size, min(nv, (b + 1) * size)):
                    best = max(best, masked[c])
                block[b] = best
            if nv > 0:
                block[(nv - 1) // size] = inf
            for j in range(_stable_top(block[:row_blocks], keep, ids)):
                if block[ids[j]] != -inf:
                    kept[r, j] = ids[j]
        if allowed_size > 0:
            for c in range(nv):
                inside = False
                for a in range(allowed.shape[1]):
                    if allowed[r, a] == c // allowed_size:
                        inside = True
                if not inside:
                    masked[c] = -inf
        for j in range(_stable_top(masked[:nv], k, ids)):
            if masked[ids[j]] != -inf:
                picked[r, j] = ids[j] + first[r]


def takes(scores: torch.Tensor) -> bool:
    """Whether `select_block` takes scores of this dtype and device."""
    return compiles(scores)


def select_block(
    scores: torch.Tensor,
    n_visible: torch.Tensor,
    first: torch.Tensor,
    k: int,
    width: int,
    publish: Candidates | None = None,
    allowed: tuple[torch.Tensor, int] | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """`select_rows` of scores [R, C] given at once (C >= every n_visible), its entry ids offset
    by `first` [R] (a row's first entry row; -1 stays -1): (ids [R, width], kept blocks
    [R, publish.keep] or None)."""
    rows = scores.shape[0]
    picked = torch.empty(rows, width, dtype=torch.int64)
    kept = torch.empty(rows, 0 if publish is None else publish.keep, dtype=torch.int64)
    restrict = torch.empty(rows, 0, dtype=torch.int64) if allowed is None else allowed[0]
    _select(
        numpy_of(scores.contiguous()), numpy_of(n_visible.contiguous()), numpy_of(first.contiguous()), k,
        1 if publish is None else publish.size, 0 if publish is None else publish.keep,
        numpy_of(restrict.contiguous()), 0 if allowed is None else allowed[1],
        numpy_of(picked), numpy_of(kept),
    )  # fmt: skip
    return picked, None if publish is None else kept


def scan(
    score: Callable[[int, int], torch.Tensor],
    n_visible: torch.Tensor,
    k: int,
    width: int,
    column_block: int,
    publish: Candidates | None = None,
    allowed: tuple[torch.Tensor, int] | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """`select_rows(score, n_visible, k, width, column_block, publish, allowed)`: one block of
    scores and the compiled selection when the block holds every row's entries."""
    n_cols = int(n_visible.max()) if n_visible.numel() else 0
    if n_cols == 0 or n_cols > column_block:
        return select_rows(score, n_visible, k, width, column_block, publish, allowed)
    scores = score(0, n_cols)
    if not takes(scores):
        block = lambda c0, c1: scores[:, c0:c1]  # noqa: E731
        return select_rows(block, n_visible, k, width, column_block, publish, allowed)
    return select_block(scores, n_visible, torch.zeros_like(n_visible), k, width, publish, allowed)
