"""The fast attention phases against `model.attention.Attention`'s, their oracle, on the TINY
layers: a batch of chunks, decode steps and prefills long enough for the union attention of
prefill blocks; and RoPE / RMSNorm loops against `model.rope` / `model.norm`."""

from __future__ import annotations

import pytest
import torch

from sglang_ds41.fast import attention as fast
from sglang_ds41.fast import rope as fast_rope
from sglang_ds41.model.attention import Attention, AttentionState, sparse_attention
from sglang_ds41.model.batch import Chunks
from sglang_ds41.model.norm import RMSNorm
from sglang_ds41.model.roles import LayerRole
from sglang_ds41.model.rope import RotaryEmbedding
from tests.model._tiny import randomize_, tiny_config
from tests.model.test_phases import LAYERS, inputs, run_alone, run_batched


class FastPhases:
    """An `Attention` layer whose phases are the fast ones (everything else is the layer's)."""

    def __init__(self, attn: Attention):
        self.attn = attn

    def __getattr__(self, name):
        return getattr(self.attn, name)

    def project(self, x, chunks, pending=None):
        return fast.project(self.attn, x, chunks, pending)

    def select(self, x, projected, chunks, view, published):
        return fast.select(self.attn, x, projected, chunks, view, published)

    def attend(self, projected, chunks, view, ids):
        return fast.attend(self.attn, projected, chunks, view, ids)


@pytest.fixture(scope="module")
def layers() -> list[Attention]:
    cfg = tiny_config()
    return [randomize_(Attention(cfg, layer), seed=10 + layer) for layer in LAYERS]


# (prefix already fed, new tokens): chunks at odd and even starts, decode steps, and prefills
# long enough that their blocks attend the union of their rows
CASES = {
    "mixed batch": [(13, 14), (0, 9), (21, 1), (30, 1)],
    "decode batch": [(40, 1), (7, 1), (64, 1)],
    "first token": [(0, 1)],
    "second tokens": [(1, 1), (2, 1)],
    "long prefill": [(0, 300)],
    "two long chunks": [(33, 170), (0, 140)],
}


@pytest.mark.parametrize("requests", CASES.values(), ids=CASES.keys())
def test_fast_phases_equal_the_oracle_phases(layers, requests):
    check_phases(tiny_config(), layers, requests)


def test_a_long_prefill_with_a_wide_window_attends_the_union_of_its_rows(monkeypatch):
    """Window 128 and top-k 512: a prefill block's tokens share most of their rows, so blocks take
    the masked-GEMM path (counted), and give the oracle's outputs and selections."""
    cfg = tiny_config(sliding_window=128, index_topk=512)
    wide = [randomize_(Attention(cfg, layer), seed=30 + layer) for layer in LAYERS]
    blocks = []
    union = fast._union_attention
    monkeypatch.setattr(fast, "_union_attention", lambda *a: blocks.append(1) or union(*a))
    check_phases(cfg, wide, [(0, 600)])
    assert len(blocks) >= 8


def test_a_decode_batch_selects_in_the_compiled_loop(layers, monkeypatch):
    """One token per request: every index source's selection is the compiled one (counted),
    and equals the oracle's, candidate blocks included."""
    calls = []
    select_block = fast.selection.select_block
    monkeypatch.setattr(fast.selection, "select_block", lambda *a: calls.append(1) or select_block(*a))
    check_phases(tiny_config(), layers, CASES["decode batch"])
    assert len(calls) == sum(a.role in (LayerRole.FULL, LayerRole.REINDEX) for a in layers) > 0


@pytest.mark.parametrize("tokens, rows", [(1, 640), (1, 1152), (2, 1024), (16, 128)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_the_gathered_loop_equals_sparse_attention_up_to_its_bound(tokens, rows, dtype):
    """The sizes a decode step of the trained shape gives (4 heads of 64; window 128 + 512 or
    1,024 entries): within LOOP_SCORES, the compiled loop; missing ids (-1) skipped; each
    token's output the same bits alone as in its batch."""
    heads, gen = 4, torch.Generator().manual_seed(rows)
    assert tokens * rows * heads <= fast.LOOP_SCORES
    pool = torch.randn(tokens * rows, 64, generator=gen, dtype=dtype)
    ids = torch.randperm(tokens * rows, generator=gen).view(tokens, rows)
    ids[:, -5:] = -1
    q = torch.randn(tokens, heads, 64, generator=gen, dtype=dtype)
    sink = torch.randn(heads, generator=gen)
    got = fast.gathered_attention(q, pool, ids, sink, 0.125)
    want = sparse_attention(q.double(), pool.double(), ids, sink.double(), 0.125)
    assert (got.double() - want).abs().max() <= (1e-6 if dtype == torch.float32 else 1e-13)
    for t in range(tokens):
        alone = fast.gathered_attention(q[t : t + 1], pool, ids[t : t + 1], sink, 0.125)
        assert torch.equal(alone[0], got[t])


def test_a_token_without_rows_gets_zeros_as_the_sink_alone_gives():
    """Every id -1 (no row yet, or none picked): the softmax holds the sink only, so the output
    is 0, as `sparse_attention` gives; a batch's other tokens are unaffected."""
    gen = torch.Generator().manual_seed(0)
    pool, q, sink = torch.randn(8, 64, generator=gen), torch.randn(2, 4, 64, generator=gen), torch.randn(4)
    ids = torch.tensor([[-1, -1, -1], [0, 3, -1]])
    got = fast.gathered_attention(q, pool, ids, sink, 0.125)
    want = sparse_attention(q.double(), pool.double(), ids, sink.double(), 0.125)
    assert torch.equal(got[0], torch.zeros(4, 64))
    assert (got.double() - want).abs().max() <= 1e-6


def check_phases(cfg, layers, requests) -> None:
    xs = [inputs(start + n, seed=b) for b, (start, n) in enumerate(requests)]
    before = []
    for x, (start, _) in zip(xs, requests, strict=True):
        empty = [AttentionState.empty(cfg, layer, torch.float64) for layer in LAYERS]
        before.append(run_alone(layers, x[:, :start], 0, empty)[2] if start else empty)
    chunks = Chunks.of([s for s, _ in requests], [n for _, n in requests])
    x = torch.cat([x[:, start:] for x, (start, _) in zip(xs, requests, strict=True)], dim=1)
    want, want_published, want_after = run_batched(layers, x, chunks, before)
    got, published, after = run_batched([FastPhases(a) for a in layers], x, chunks, before)
    for layer in LAYERS:
        scale = want[layer].abs().max()
        assert (got[layer] - want[layer]).abs().max() <= 1e-12 * scale, layer
        for b in range(len(requests)):
            assert torch.equal(after[layer][b].window, want_after[layer][b].window), (layer, b)
    for layer, picked in want_published.selection.items():
        assert torch.equal(published.selection[layer], picked), layer
    assert torch.equal(published.candidates, want_published.candidates)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_rope_and_norm_loops_equal_the_oracle(dtype):
    cfg = tiny_config()
    gen = torch.Generator().manual_seed(0)
    positions = torch.tensor([0, 1, 7, 500, 3000, 9000, 2])  # past the first table: it grows
    x = torch.randn(7, 4, 64, generator=gen, dtype=dtype)
    norm = RMSNorm(64, cfg.rms_norm_eps).to(dtype).requires_grad_(False)
    norm.weight.uniform_(0.5, 1.5, generator=gen)
    for ratio in (0, 2):
        rope = RotaryEmbedding.for_layer(cfg, ratio)
        for inverse in (False, True):
            assert torch.equal(fast_rope.rotate(rope, x, positions, inverse), rope(x, positions, inverse))
        rows = x[:, 0]
        tol = 1e-6 if dtype == torch.float32 else 1e-14
        assert torch.allclose(fast_rope.rms_norm(norm, rows), norm(rows), rtol=tol, atol=0)
        got = fast_rope.norm_rotate(norm, rope, rows, positions)
        assert torch.allclose(got, rope(norm(rows), positions), rtol=tol, atol=tol)
