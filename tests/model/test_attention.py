import math

import pytest
import torch

from sglang_ds41.errors import Ds41Error
from sglang_ds41.formats.kv_quant import fake_quant_window_fp8
from sglang_ds41.model.attention import Attention, AttentionState, Published, sparse_attention, window_ids
from sglang_ds41.model.batch import Chunks
from sglang_ds41.model.indexer import visible_counts
from sglang_ds41.model.roles import LayerRole, layer_role

from ._tiny import randomize_, tiny_config

F64 = torch.float64


def test_sink_joins_the_softmax_denominator_only():
    q = torch.tensor([[[1.0, 0.0]]], dtype=F64)  # [T=1, H=1, Dh=2]
    pool = torch.tensor([[2.0, 3.0]], dtype=F64)  # the token's own K = V
    ids = torch.tensor([[0]])
    v = pool[0]
    # s = (q . k) * 0.5 = 1; o = v * e^1 / (e^1 + e^sink)
    for sink, factor in ((0.0, math.e / (math.e + 1)), (1.0, 0.5), (-math.inf, 1.0)):
        o = sparse_attention(q, pool, ids, torch.tensor([sink]), scale=0.5)
        assert torch.allclose(o[0, 0], factor * v, rtol=1e-15, atol=0)


def test_one_token_layer_output_is_its_value_scaled_by_the_sink():
    cfg = tiny_config()
    attn = randomize_(Attention(cfg, 0), seed=5)
    with torch.no_grad():
        attn.attn_sink.copy_(torch.tensor([-math.inf, 0.0, 1.0, 30.0]))
    x = torch.randn(1, cfg.hidden_size, dtype=F64)
    y, _ = attn(x, torch.tensor([0]), AttentionState.empty(cfg, 0, F64), Published())
    # Position 0: RoPE is the identity, so K = V = the FP8 window latent and q is unrotated.
    kv = fake_quant_window_fp8(attn.kv_norm(attn.wkv(x)))[0]  # [64]
    q = attn.wq_b(attn.q_norm(attn.wq_a(x)))[0].view(4, 64)
    o = []
    for h in range(4):
        s = (q[h] @ kv).item() / 8.0
        o.append(kv / (1 + math.exp(attn.attn_sink[h].item() - s)))
    want = attn.project_out(torch.stack(o)[None], torch.tensor([0]))
    assert torch.allclose(y, want, rtol=1e-12, atol=1e-12)


def test_padding_ids_are_ignored():
    q = torch.tensor([[[1.0, 1.0]]], dtype=F64)
    pool = torch.tensor([[1.0, 0.0], [0.0, 5.0]], dtype=F64)
    with_pad = sparse_attention(q, pool, torch.tensor([[-1, 0, -1]]), torch.tensor([-math.inf]), 1.0)
    assert torch.allclose(with_pad[0, 0], pool[0], rtol=0, atol=0)


@pytest.mark.parametrize(("tokens", "rows", "missing"), [(1, 40, 0), (3, 20, 5)])
def test_sparse_attention_is_the_per_token_softmax_with_a_sink(tokens, rows, missing):
    """Against the formula token by token and head by head, with ids of -1 (skipped) and a
    token that sees no row at all (only its sink: o = 0)."""
    gen = torch.Generator().manual_seed(rows)
    q = torch.randn(tokens, 2, 8, generator=gen, dtype=F64)
    pool = torch.randn(tokens * rows, 8, generator=gen, dtype=F64)
    ids = torch.stack([torch.randperm(tokens * rows, generator=gen)[:rows] for _ in range(tokens)])
    ids[:, :missing] = -1
    if missing:
        ids[-1] = -1
    sink = torch.randn(2, generator=gen, dtype=F64)
    got = sparse_attention(q, pool, ids, sink, 0.25)
    for t in range(tokens):
        kv = pool[ids[t][ids[t] >= 0]]
        for h in range(2):
            e = torch.exp(kv @ q[t, h] * 0.25)
            want = (e[:, None] * kv).sum(0) / (e.sum() + torch.exp(sink[h]))
            assert torch.allclose(got[t, h], want, rtol=1e-12, atol=1e-15)


def test_window_ids_cover_the_last_window_tokens_including_self():
    # rows of (the previous window, then the new tokens): 2 tokens before, 3 new, window 3
    assert window_ids(Chunks.of([2], [3]), 3).tolist() == [[0, 1, 2], [1, 2, 3], [2, 3, 4]]
    assert window_ids(Chunks.of([0], [3]), 4).tolist() == [[-1, -1, -1, 0], [-1, -1, 0, 1], [-1, 0, 1, 2]]


def test_grouped_output_projection_matches_per_group_loop():
    cfg = tiny_config()  # 4 heads of 64, 2 groups, o_lora_rank 32
    attn = randomize_(Attention(cfg, 0), seed=1)
    o = torch.randn(3, 4, 64, dtype=F64)
    positions = torch.zeros(3, dtype=torch.long)  # RoPE is the identity at position 0
    got = attn.project_out(o, positions)
    u = []
    for g in range(2):
        heads = torch.cat([o[:, h] for h in (2 * g, 2 * g + 1)], dim=-1)  # [T, 128]
        u.append(heads @ attn.wo_a.weight[32 * g : 32 * (g + 1)].T)  # [T, 32]
    want = torch.cat(u, dim=-1) @ attn.wo_b.weight.T
    assert torch.allclose(got, want, rtol=1e-13, atol=1e-13)


def test_tiny_schedule_roles():
    cfg = tiny_config()
    roles = [layer_role(cfg, layer) for layer in range(8)]
    W, F, X, R = LayerRole.WINDOW, LayerRole.FULL, LayerRole.REINDEX, LayerRole.REUSE
    assert roles == [W, W, F, R, F, R, X, R]


# --- causality: the property the runtimes rely on ------------------------------------------


class TinyStack:
    """The 8 TINY attention layers, each with its own random input sequence."""

    def __init__(self, length: int = 40):
        self.cfg = tiny_config()
        self.layers = [randomize_(Attention(self.cfg, layer), seed=10 + layer) for layer in range(8)]
        gen = torch.Generator().manual_seed(0)
        self.x = torch.randn(8, length, self.cfg.hidden_size, generator=gen, dtype=F64)

    def run(self, chunks: list[int]) -> tuple[list[torch.Tensor], list[AttentionState], list[Published]]:
        states = [AttentionState.empty(self.cfg, layer, F64) for layer in range(8)]
        outputs: list[list[torch.Tensor]] = [[] for _ in range(8)]
        published_per_call, start = [], 0
        with torch.no_grad():
            for n in chunks:
                positions = torch.arange(start, start + n)
                published = Published()
                for layer, attn in enumerate(self.layers):
                    x = self.x[layer, start : start + n]
                    y, states[layer] = attn(x, positions, states[layer], published)
                    outputs[layer].append(y)
                published_per_call.append(published)
                start += n
        return [torch.cat(ys) for ys in outputs], states, published_per_call


def block_mask(kept: torch.Tensor, n_blocks: int) -> torch.Tensor:
    """Kept block ids [T, keep] (-1 = none) -> bool [T, n_blocks]."""
    mask = torch.zeros(kept.shape[0], n_blocks + 1, dtype=torch.bool)
    return mask.scatter(1, kept.clamp(min=-1) + 1, True)[:, 1:]


@pytest.fixture(scope="module")
def stack() -> TinyStack:
    return TinyStack()


@pytest.fixture(scope="module")
def one_shot(stack):
    return stack.run([40])


def test_one_shot_exercises_every_selection_path(one_shot):
    _, _, (published,) = one_shot
    n_visible = visible_counts(torch.arange(40), 1)
    # Ratio-1 index sources pick 4 of up to 40 visible entries; the consumer (6) only from the
    # 2 of 10 candidate blocks that layer 4 kept.
    assert ((published.selection[4] >= 0).sum(dim=1) == n_visible.clamp(max=4)).all()
    candidates = block_mask(published.candidates, 10)  # the kept block ids as a mask
    assert (candidates.sum(dim=1) <= 2).all() and candidates.shape[1] == 10
    allowed = candidates.repeat_interleave(4, dim=1)
    sel = published.selection[6]
    assert allowed.gather(1, sel.clamp(min=0))[sel >= 0].all()
    assert not torch.equal(published.selection[4], sel)
    # Ratio 2: token t sees floor((t+1)/2) entries; nothing at t = 0.
    assert (published.selection[2][0] == -1).all()


def test_prefix_outputs_do_not_depend_on_later_tokens(stack, one_shot):
    full, _, _ = one_shot
    prefix, _, _ = stack.run([25])
    for layer in range(8):
        assert torch.allclose(prefix[layer], full[layer][:25], rtol=0, atol=1e-12), layer


def test_chunked_prefill_with_odd_boundaries_equals_one_shot(stack, one_shot):
    full, full_states, _ = one_shot
    chunked, states, _ = stack.run([13, 14, 13])
    for layer in range(8):
        assert torch.allclose(chunked[layer], full[layer], rtol=0, atol=1e-12), layer
        assert torch.allclose(states[layer].window, full_states[layer].window, rtol=0, atol=1e-12)
    for layer in (2, 4):
        got, want = states[layer].compressed, full_states[layer].compressed
        assert torch.allclose(got.kv, want.kv, rtol=0, atol=1e-12)
        assert torch.allclose(got.index_keys, want.index_keys, rtol=0, atol=1e-12)


def test_prefill_then_single_token_decode_equals_one_shot(stack, one_shot):
    full, _, _ = one_shot
    decoded, states, _ = stack.run([13, 19] + [1] * 8)
    for layer in range(8):
        assert torch.allclose(decoded[layer], full[layer], rtol=0, atol=1e-12), layer
    assert states[0].window.shape[0] == 8  # sliding_window
    assert states[2].compressed.kv.shape[0] == 20 and states[2].compressed.pending is None
    assert states[4].compressed.index_keys.shape == (40, 32)
    assert states[3].compressed is None


def test_odd_prefix_leaves_a_pending_token(stack):
    _, states, _ = stack.run([13])
    assert states[2].compressed.kv.shape[0] == 6
    assert states[2].compressed.pending.shape == (2, 64)


def test_missing_window_history_is_an_error():
    cfg = tiny_config()
    attn = randomize_(Attention(cfg, 0), seed=0)
    x = torch.randn(1, cfg.hidden_size, dtype=F64)
    with pytest.raises(Ds41Error, match="window state holds 0 tokens"):
        attn(x, torch.tensor([5]), AttentionState.empty(cfg, 0, F64), Published())


def test_mismatched_compressed_state_is_an_error():
    cfg = tiny_config()
    attn = randomize_(Attention(cfg, 2), seed=0)
    state = AttentionState.empty(cfg, 2, F64)
    state.window = torch.zeros(8, cfg.head_dim, dtype=F64)
    with pytest.raises(Ds41Error, match="compressed state holds 0 entries, expected 5"):
        attn(torch.randn(1, cfg.hidden_size, dtype=F64), torch.tensor([10]), state, Published())


def test_reuse_layer_without_its_source_is_an_error():
    cfg = tiny_config()
    attn = randomize_(Attention(cfg, 3), seed=0)
    state = AttentionState.empty(cfg, 3, F64)
    with pytest.raises(Ds41Error, match="layer 2 is missing"):
        attn(torch.randn(1, cfg.hidden_size, dtype=F64), torch.tensor([0]), state, Published())


def test_bf16_layers_keep_bf16_activations_and_fp32_pending_pair():
    cfg = tiny_config()
    layers = [randomize_(Attention(cfg, layer), seed=layer).to(torch.bfloat16) for layer in range(4)]
    states = [AttentionState.empty(cfg, layer, torch.bfloat16) for layer in range(4)]
    published = Published()
    x = torch.randn(5, cfg.hidden_size).to(torch.bfloat16)
    for layer, attn in enumerate(layers):
        y, states[layer] = attn(x, torch.arange(5), states[layer], published)
        assert y.dtype == torch.bfloat16 and torch.isfinite(y.float()).all()
    compressed = states[2].compressed
    assert compressed.kv.dtype == compressed.index_keys.dtype == torch.bfloat16
    assert compressed.pending.dtype == torch.float32  # (a, z) stay in fp32 between calls
