"""The attention phases (project -> commit -> select -> attend) on the TINY layers (MODEL.md §11).

* run over a batch of requests at once (varlen rows), they give what `Attention.forward` gives
  each request alone: outputs, selections, candidate blocks, states;
* the indexer's blocked scan (any row / column block) picks what the dense definition picks
  (`Indexer.scores` over all entries, `mask_invisible`, `candidate_blocks`,
  `restrict_to_blocks`, `select_topk`), ties to the lower entry id;
* it never scores more than its block bound at once.
"""

from __future__ import annotations

import pytest
import torch

from sglang_ds41.model.attention import (
    Attention,
    AttentionState,
    CompressedKV,
    NewEntries,
    Projected,
    Published,
    TensorView,
)
from sglang_ds41.model.batch import Chunks
from sglang_ds41.model.indexer import (
    Indexer,
    candidate_blocks,
    mask_invisible,
    restrict_to_blocks,
    select_topk,
    visible_counts,
)
from sglang_ds41.model.roles import LayerRole

from ._tiny import randomize_, tiny_config

F64 = torch.float64
LAYERS = range(8)


@pytest.fixture(scope="module")
def layers() -> list[Attention]:
    cfg = tiny_config()
    return [randomize_(Attention(cfg, layer), seed=10 + layer) for layer in LAYERS]


def inputs(length: int, seed: int) -> torch.Tensor:
    """Random layer inputs [8 layers, length, D] of one request."""
    return torch.randn(8, length, 64, generator=torch.Generator().manual_seed(seed), dtype=F64)


@torch.no_grad()
def run_alone(layers, x: torch.Tensor, start: int, states: list[AttentionState]):
    """One request's chunk x[:, start:] through `Attention.forward`: (outputs, published, states)."""
    positions = torch.arange(start, x.shape[1])
    published, ys, after = Published(), [], []
    for attn, state in zip(layers, states, strict=True):
        y, state = attn(x[attn.layer, start:], positions, state, published)
        ys.append(y)
        after.append(state)
    return ys, published, after


def split(projected: Projected, chunks: Chunks, b: int, ratio: int) -> Projected:
    """Request b's part of a batch's projected values."""
    rows = slice(int(chunks.offsets[b]), int(chunks.offsets[b + 1]))
    new = projected.entries
    if new is None:
        return Projected(projected.q_lora[rows], projected.q[rows], projected.window_kv[rows])
    counts = chunks.entry_counts(ratio) - torch.div(chunks.starts, ratio, rounding_mode="floor")
    first = int(counts[:b].sum())
    entries = slice(first, first + int(counts[b]))
    pending = None
    if new.pending is not None and int(chunks.ends[b]) % 2:
        pending = new.pending[b : b + 1]
    part = NewEntries(new.rotated[entries], new.kv[entries], new.index_keys[entries], pending)
    return Projected(projected.q_lora[rows], projected.q[rows], projected.window_kv[rows], part)


@torch.no_grad()
def run_batched(layers, x: torch.Tensor, chunks: Chunks, states: list[list[AttentionState]]):
    """The batch through the phases, each once for all requests; commit = `AttentionState.after`
    per request, the view = the requests' rows concatenated. -> (outputs, published, states)."""
    published, ys, caches = Published(), [], {}
    after_all = [[None] * len(states) for _ in LAYERS]
    lo = chunks.window_starts(layers[0].window)
    for attn in layers:
        layer = attn.layer
        pending = None
        if attn.role is LayerRole.FULL and attn.ratio == 2:
            rows = [s[layer].compressed.pending for s in states]
            pending = torch.stack([torch.zeros(2, 64, dtype=F64) if p is None else p for p in rows])
        projected = attn.project(x[layer], chunks, pending)
        after = [s[layer].after(split(projected, chunks, b, attn.ratio)) for b, s in enumerate(states)]
        window = torch.cat(
            [a.window[a.window.shape[0] - int(chunks.ends[b] - lo[b]) :] for b, a in enumerate(after)]
        )
        if attn.role is LayerRole.FULL:
            kv, keys = (torch.cat([getattr(a.compressed, f) for a in after]) for f in ("kv", "index_keys"))
            caches[layer] = CompressedKV(kv, keys)
        view = TensorView(window, None if attn.role is LayerRole.WINDOW else caches[attn.kv_source])
        ids = attn.select(x[layer], projected, chunks, view, published)
        ys.append(attn.attend(projected, chunks, view, ids))
        for b, a in enumerate(after):
            after_all[layer][b] = AttentionState(a.window[-attn.window :], a.compressed)
    return ys, published, after_all


# (prefix already fed, new tokens) per request: a chunk continuing at an odd position (ratio-2
# pending token), a first chunk, a decode step, a decode step at an odd position
REQUESTS = [(13, 14), (0, 9), (21, 1), (30, 1)]


def test_batched_phases_equal_each_request_alone(layers):
    cfg = tiny_config()
    xs = [inputs(start + n, seed=b) for b, (start, n) in enumerate(REQUESTS)]
    alone, before = [], []
    for x, (start, _) in zip(xs, REQUESTS, strict=True):
        empty = [AttentionState.empty(cfg, layer, F64) for layer in LAYERS]
        states = run_alone(layers, x[:, :start], 0, empty)[2] if start else empty
        before.append(states)
        alone.append(run_alone(layers, x, start, states))
    chunks = Chunks.of([s for s, _ in REQUESTS], [n for _, n in REQUESTS])
    x = torch.cat([x[:, start:] for x, (start, _) in zip(xs, REQUESTS, strict=True)], dim=1)
    ys, published, after = run_batched(layers, x, chunks, before)
    for layer in LAYERS:
        want = torch.cat([a[0][layer] for a in alone])
        assert torch.allclose(ys[layer], want, rtol=0, atol=1e-12), layer
        for b, a in enumerate(alone):
            got, expect = after[layer][b], a[2][layer]
            assert torch.allclose(got.window, expect.window, rtol=0, atol=0)
            if expect.compressed is not None:
                assert torch.equal(got.compressed.kv, expect.compressed.kv)
                assert torch.equal(got.compressed.index_keys, expect.compressed.index_keys)
                pending = got.compressed.pending, expect.compressed.pending
                same = pending[0] is pending[1] is None or torch.allclose(*pending, rtol=0, atol=1e-12)
                assert same, (layer, b)
    for layer in (2, 4, 6):  # the index sources: batch entry rows = each request's + its offset
        offsets = chunks.entry_offsets(layers[layer].ratio)
        for b, a in enumerate(alone):
            rows = slice(int(chunks.offsets[b]), int(chunks.offsets[b + 1]))
            mine = a[1].selection[layer]
            got = published.selection[layer][rows, : mine.shape[1]]
            assert torch.equal(got, torch.where(mine >= 0, mine + offsets[b], -1)), (layer, b)
            assert (published.selection[layer][rows, mine.shape[1] :] == -1).all()
            if layer == 4:
                assert torch.equal(published.candidates[rows], a[1].candidates)


def dense_selection(layers, x: torch.Tensor, states: list[AttentionState]):
    """The definition: every entry scored at once -> {layer: entry ids}, layer 4's block mask."""
    positions = torch.arange(x.shape[1])
    picked, blocks = {}, None
    for layer in (2, 4, 6):
        attn = layers[layer]
        q_lora = attn.q_norm(attn.wq_a(x[layer]))
        keys = states[attn.kv_source].compressed.index_keys
        n_visible = visible_counts(positions, attn.ratio)
        scores = mask_invisible(attn.indexer.scores(x[layer], q_lora, positions, keys), n_visible)
        if layer == 4:
            size, keep = attn.candidate_block_size, attn.candidate_topk_blocks
            blocks = candidate_blocks(scores, n_visible, size, keep)
        if layer == 6:
            scores = restrict_to_blocks(scores, blocks, attn.candidate_block_size)
        picked[layer] = select_topk(scores, attn.index_topk)
    return picked, blocks


def ascending(picks: torch.Tensor) -> torch.Tensor:
    """Entry ids [R, k] sorted ascending, the -1 (none) after them."""
    last = int(picks.max()) + 1
    ids = torch.where(picks < 0, last, picks).sort(dim=1).values
    return torch.where(ids == last, -1, ids)


@pytest.mark.parametrize(("row_block", "score_block"), [(512, 1 << 22), (5, 1), (3, 80), (64, 200)])
def test_the_blocked_indexer_picks_what_the_dense_definition_picks(layers, row_block, score_block):
    cfg = tiny_config()
    x = inputs(40, seed=7)
    for attn in layers:
        attn.row_block, attn.score_block = row_block, score_block
    try:
        empty = [AttentionState.empty(cfg, layer, F64) for layer in LAYERS]
        _, published, states = run_alone(layers, x, 0, empty)
    finally:
        for attn in layers:
            attn.row_block, attn.score_block = 512, 1 << 22
    with torch.no_grad():
        picked, blocks = dense_selection(layers, x, states)
    for layer in (2, 4, 6):
        got, want = published.selection[layer], picked[layer]
        small = visible_counts(torch.arange(40), layers[layer].ratio) <= layers[layer].index_topk
        assert torch.equal(got[~small], want[~small]), layer  # the same entries in the same order
        # a row that sees at most k entries picks them all: the same set, in id order
        assert torch.equal(got[small], ascending(want[small])), layer
    mask = torch.zeros(40, blocks.shape[1] + 1, dtype=torch.bool).scatter(1, published.candidates + 1, True)
    assert torch.equal(mask[:, 1:], blocks)


def test_the_scan_never_scores_more_than_its_bound(layers, monkeypatch):
    """A 40-token chunk over 40 entries in blocks: no score tensor [rows, heads, entries] beyond
    the bound (the dense form's is [40, 2, 40]); the real `weigh` runs, its sizes recorded."""
    cfg = tiny_config()
    sizes = []
    weigh = Indexer.weigh

    def recorded(q: torch.Tensor, w: torch.Tensor, keys: torch.Tensor) -> torch.Tensor:
        sizes.append(q.shape[0] * q.shape[1] * q.shape[2] * keys.shape[1])  # B x rows x heads x entries
        return weigh(q, w, keys)

    monkeypatch.setattr(Indexer, "weigh", staticmethod(recorded))
    for attn in layers:
        attn.row_block, attn.score_block = 8, 64
    try:
        empty = [AttentionState.empty(cfg, layer, F64) for layer in LAYERS]
        run_alone(layers, inputs(40, seed=3), 0, empty)
    finally:
        for attn in layers:
            attn.row_block, attn.score_block = 512, 1 << 22
    assert len(sizes) > 10 and max(sizes) <= 64


def test_a_context_under_k_entries_picks_every_entry_without_scores(layers, monkeypatch):
    """Four tokens: no row of any index source sees more than k = 4 entries (nor more than the
    candidate source keeps blocks), so every layer picks all it sees, in id order, and no score
    is computed; the sets are the dense definition's."""
    cfg = tiny_config()
    x = inputs(4, seed=11)
    with torch.no_grad():
        empty = [AttentionState.empty(cfg, layer, F64) for layer in LAYERS]
        _, _, states = run_alone(layers, x, 0, empty)  # the definition's keys, scored freely
        picked, _ = dense_selection(layers, x, states)

    def refused(*args):
        raise AssertionError("scored")

    monkeypatch.setattr(Indexer, "weigh", staticmethod(refused))
    empty = [AttentionState.empty(cfg, layer, F64) for layer in LAYERS]
    _, published, _ = run_alone(layers, x, 0, empty)
    for layer in (2, 4, 6):
        assert torch.equal(published.selection[layer], ascending(picked[layer])), layer
        assert (published.selection[layer] >= 0).any(), layer
