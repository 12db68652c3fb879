"""The indexer's selection (`model.selection.scan_rows`, MODEL.md §4.5) of scores delivered
in one block, as one compiled loop.

A decode step's rows see at most a few thousand entries each, so their scores fit one column
block and the running top-k of `select_rows` merges a single block: its ~30 small ops (mask,
block scores, candidate top-k, restriction, top-k, the tie-break of equal values) cost more than
the scores; for a prefill block's rows the running top-k's sorts of [rows, entries] dominate.
Here the column blocks' scores are joined (up to `WHOLE_ROWS`), and each row is masked, its candidate
blocks scored and picked, and its entries picked in one pass, with the oracle's rule: the
largest values first, ties to the lower id, -inf never picked; a row that sees at most k
entries takes them all in id order without a sort, as `scan_rows` publishes it.

The top-k of a long row is a radix sort, not partition + merge sort (whose comparisons of
scores mispredict: ~120 us for 1,024 of 4,000 entries): each score becomes an unsigned key
with the float's order (-0.0 equal to 0.0), one pass buckets the keys by their top bits,
and only the buckets up to the k-th key are sorted, by a stable LSD radix sort, so equal
scores keep id order (~25 us).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch

from sglang_ds41.model.selection import Candidates, scan_rows

from .jit import compiled, compiles, host_empty, numpy_of

# The most scores (rows x entries, 64 MiB in fp32) the compiled scan holds at once: a block of
# 512 prefill rows over up to 32k entries; past it, the oracle's running top-k (bounded memory).
WHOLE_ROWS = 1 << 24
# Up to this many picks, insertion into a sorted run beats sorting every value.
SMALL_TOP = 16
# The radix sort's digit: 8 bits, 4 passes over a float32 score's key, 8 over a float64 one
# (a pass whose digit is the same in every key is skipped).
_DIGIT_BITS = 8
# Where m of n values are wanted, m < 0.8 n: the key bits that bucket them first (sign, exponent
# and 3 mantissa bits of a float32), so only the buckets up to the m-th value's are sorted.
_TOP_BITS = 12
_SIGN32 = np.uint64(1) << np.uint64(31)
_LOW32 = (np.uint64(1) << np.uint64(32)) - np.uint64(1)
_SIGN64 = np.uint64(1) << np.uint64(63)


@compiled
def _stable_top(values, m, out):
    """The ids of the min(m, n) largest of values [n] (finite or +-inf), largest first, ties to
    the lower id, written to out[:min(m, n)]; returns how many."""
    n = values.shape[0]
    if m <= 0:
        return 0
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
    keys, digits = _descending_keys(values)
    ids = np.arange(n)
    if 5 * m < 4 * n:  # sort only the keys whose top bits place them at or before the m-th
        shift = np.uint64(digits * _DIGIT_BITS - _TOP_BITS)
        counts = np.zeros(1 << _TOP_BITS, np.int64)
        for i in range(n):
            counts[np.intp(keys[i] >> shift)] += 1
        last, total = 0, counts[0]
        while total < m:
            last += 1
            total += counts[last]
        kept = 0
        for i in range(n):  # in id order: ties stay in it
            if np.intp(keys[i] >> shift) <= last:
                keys[kept], ids[kept] = keys[i], i
                kept += 1
        keys, ids = keys[:kept], ids[:kept]
    order = _radix_order(keys, digits)
    taken = min(m, n)
    for j in range(taken):
        out[j] = ids[order[j]]
    return taken


@compiled
def _descending_keys(values):
    """Unsigned keys of values [n] that order them largest first (a float's bits made
    order-preserving; -0.0 ties with 0.0), and their width in radix digits."""
    n = values.shape[0]
    keys = np.empty(n, np.uint64)
    if values.itemsize == 4:
        canonical32 = np.empty(n, np.float32)
        for i in range(n):
            canonical32[i] = values[i] + np.float32(0.0)  # -0.0 + 0.0 = 0.0
        bits32 = canonical32.view(np.uint32)
        for i in range(n):
            b = np.uint64(bits32[i])
            ascending = (~b & _LOW32) if b & _SIGN32 else b | _SIGN32  # float order as unsigned
            keys[i] = ~ascending & _LOW32  # largest value first
        digits = 32 // _DIGIT_BITS
    else:
        canonical = np.empty(n, np.float64)
        for i in range(n):
            canonical[i] = values[i] + 0.0
        bits = canonical.view(np.uint64)
        for i in range(n):
            b = bits[i]
            ascending = ~b if b & _SIGN64 else b | _SIGN64
            keys[i] = ~ascending
        digits = 64 // _DIGIT_BITS
    return keys, digits


@compiled
def _radix_order(keys, digits):
    """The positions of keys [n] in ascending order, equal keys in position order: an LSD radix
    sort, `digits` passes (stable; no data-dependent branches, which partition and merge sort
    mispredict on scores)."""
    n = keys.shape[0]
    radix = 1 << _DIGIT_BITS
    mask = np.uint64(radix - 1)
    counts = np.zeros((digits, radix), np.int64)
    for i in range(n):
        key = keys[i]
        for d in range(digits):
            counts[d, np.intp((key >> np.uint64(d * _DIGIT_BITS)) & mask)] += 1
    order = np.arange(n)
    spare_keys, spare_order = np.empty(n, np.uint64), np.empty(n, np.int64)
    starts = np.empty(radix, np.int64)
    for d in range(digits):
        if counts[d].max() == n:  # one digit value everywhere: the pass keeps the order
            continue
        total = 0
        for v in range(radix):
            starts[v] = total
            total += counts[d, v]
        shift = np.uint64(d * _DIGIT_BITS)
        for i in range(n):
            digit = np.intp((keys[i] >> shift) & mask)
            at = starts[digit]
            starts[digit] = at + 1
            spare_keys[at], spare_order[at] = keys[i], order[i]
        keys, spare_keys = spare_keys, keys
        order, spare_order = spare_order, order
    return order


@compiled
def _select(scores, n_visible, first, k, size, keep, allowed, allowed_size, picked, kept):
    """Each row r of scores [R, C]: entries >= n_visible[r] masked; with keep > 0 its best
    `keep` blocks of `size` entries (its newest visible block forced in) into kept [R, keep];
    with allowed [R, A] (allowed_size > 0) only the entries inside those blocks compete; its best k
    entries, offset by first[r], into picked [R, width]. -1 fills both. A row that sees at most
    k entries (at most `keep` blocks) takes all of them in id order, unscored
    (`small_rows_in_id_order`)."""
    rows, cols = scores.shape
    inf = np.inf
    n_blocks = -(-cols // size) if keep > 0 else 0
    masked = np.empty(cols, scores.dtype)
    block = np.empty(n_blocks, scores.dtype)
    inside = np.empty(-(-cols // allowed_size) if allowed_size > 0 else 0, np.bool_)  # per allowed-size block
    ids = np.empty(max(cols, n_blocks), np.int64)
    entry = np.empty(cols if allowed_size > 0 else 0, np.int64)  # an allowed entry's id
    picked[:] = -1
    kept[:] = -1
    for r in range(rows):
        nv = min(n_visible[r], cols)  # entries past it score -inf: never picked, never kept
        row_blocks = -(-nv // size)
        scored_blocks = keep > 0 and row_blocks > keep
        scored_picks = nv > k
        if scored_blocks or scored_picks:
            for c in range(nv):
                masked[c] = scores[r, c]
        if scored_blocks:
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
        elif keep > 0:  # every visible block, in id order
            for b in range(row_blocks):
                kept[r, b] = b
        if allowed_size > 0:
            for b in range(-(-nv // allowed_size)):
                inside[b] = _inside(allowed, r, b)
        if not scored_picks:  # every visible entry of the allowed blocks, in id order
            j = 0
            for c in range(nv):
                if allowed_size == 0 or inside[c // allowed_size]:
                    picked[r, j] = c + first[r]
                    j += 1
            continue
        n = nv
        if allowed_size > 0:  # only the entries of the allowed blocks compete, in id order
            n = 0
            for c in range(nv):
                if inside[c // allowed_size]:
                    masked[n], entry[n] = masked[c], c
                    n += 1
        for j in range(_stable_top(masked[:n], k, ids)):
            if masked[ids[j]] != -inf:
                picked[r, j] = (ids[j] if allowed_size == 0 else entry[ids[j]]) + first[r]


@compiled
def _inside(allowed, r, block):
    """Whether `block` is one of row r's allowed blocks."""
    for a in range(allowed.shape[1]):  # noqa: SIM110 (a compiled loop: no generators)
        if allowed[r, a] == block:
            return True
    return False


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
    """`scan_rows` of scores [R, C] given at once (C >= every n_visible), its entry ids offset
    by `first` [R] (a row's first entry row; -1 stays -1): (ids [R, width], kept blocks
    [R, publish.keep] or None)."""
    rows = scores.shape[0]
    picked, picked_ = host_empty(rows, width, dtype=torch.int64)
    kept, kept_ = host_empty(rows, 0 if publish is None else publish.keep, dtype=torch.int64)
    restrict = torch.empty(rows, 0, dtype=torch.int64) if allowed is None else allowed[0]
    _select(
        numpy_of(scores.contiguous()), numpy_of(n_visible.contiguous()), numpy_of(first.contiguous()), k,
        1 if publish is None else publish.size, 0 if publish is None else publish.keep,
        numpy_of(restrict.contiguous()), 0 if allowed is None else allowed[1],
        picked_, kept_,
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
    """`scan_rows(score, n_visible, k, width, column_block, publish, allowed)`: the rows' scores
    (column block after column block, as the oracle scores them, up to WHOLE_ROWS scores in all)
    and the compiled selection over whole rows."""
    n_cols = int(n_visible.max()) if n_visible.numel() else 0
    if n_cols == 0 or n_visible.numel() * n_cols > max(WHOLE_ROWS, n_visible.numel() * column_block):
        return scan_rows(score, n_visible, k, width, column_block, publish, allowed)
    scores = score(0, min(column_block, n_cols))
    if n_cols > column_block:  # one buffer, block by block (never two copies of the rows)
        block, scores = scores, scores.new_empty(scores.shape[0], n_cols)
        scores[:, :column_block] = block
        del block
        for c0 in range(column_block, n_cols, column_block):
            scores[:, c0 : min(c0 + column_block, n_cols)] = score(c0, min(c0 + column_block, n_cols))
    if not takes(scores):
        block = lambda c0, c1: scores[:, c0:c1]  # noqa: E731
        return scan_rows(block, n_visible, k, width, column_block, publish, allowed)
    return select_block(scores, n_visible, torch.zeros_like(n_visible), k, width, publish, allowed)
