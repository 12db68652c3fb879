"""A decode step's projections as loops (queries and window keys, a KV source's entries, the
index queries, the way back through the output), against the pieces they are (`Attention`'s
and `Indexer`'s linears, norms and rotations), on the TINY layers and the trained shape."""

from __future__ import annotations

import pytest
import torch

from sglang_ds41.fast import attention as fast_attention
from sglang_ds41.fast import projection as fast
from sglang_ds41.model.attention import Attention
from sglang_ds41.model.batch import Chunks
from tests.model._tiny import randomize_, tiny_config

SHAPES = {"tiny": {}, "trained": {"hidden_size": 128, "q_lora_rank": 64, "head_dim": 64}}


def layer(dtype: torch.dtype, shape: str | dict = "tiny", number: int = 2) -> Attention:
    dims = SHAPES[shape] if isinstance(shape, str) else shape
    attn = randomize_(Attention(tiny_config(**dims), number), seed=number)
    return attn.to(dtype).requires_grad_(False)


def pieces(attn: Attention, x: torch.Tensor, positions: torch.Tensor):
    q_lora = attn.q_norm(attn.wq_a(x))
    q = attn.rope(attn.wq_b(q_lora).unflatten(-1, (attn.n_heads, attn.head_dim)), positions)
    return q_lora, q, attn.rope(attn.kv_norm(attn.wkv(x)), positions)


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("tokens", [1, 5, fast.LOOP_TOKENS])
def test_the_loop_gives_the_pieces_values(shape, dtype, tokens):
    attn = layer(dtype, shape)
    gen = torch.Generator().manual_seed(tokens)
    x = torch.randn(tokens, attn.wq_a.in_features, generator=gen, dtype=dtype)
    positions = torch.randint(0, 5000, (tokens,), generator=gen)  # past the first table: it grows
    got = fast.project_rows(attn, x, positions)
    assert got is not None
    tolerance = 1e-5 if dtype == torch.float32 else 1e-13
    for a, b in zip(got, pieces(attn, x, positions), strict=True):
        assert a.dtype == dtype and a.shape == b.shape
        assert float((a - b).abs().max() / b.abs().max()) < tolerance


def test_a_tokens_rows_are_the_same_bits_alone_as_in_its_batch():
    attn = layer(torch.float32)
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(9, attn.wq_a.in_features, generator=gen)
    positions = torch.arange(100, 109)
    batch = fast.project_rows(attn, x, positions)
    for t in range(9):
        alone = fast.project_rows(attn, x[t : t + 1], positions[t : t + 1])
        for a, b in zip(alone, batch, strict=True):
            assert torch.equal(a[0], b[t]), t


def test_the_phase_takes_the_loop_up_to_its_bound_and_the_gemms_past_it(monkeypatch):
    attn = layer(torch.float32)
    taken = []
    loop = fast._project
    monkeypatch.setattr(fast, "_project", lambda *a: taken.append(a[0].shape[0]) or loop(*a))
    for tokens in (1, fast.LOOP_TOKENS, fast.LOOP_TOKENS + 1):
        x = torch.randn(tokens, attn.wq_a.in_features)
        projected = fast_attention.project(attn, x, Chunks.of([0], [tokens]))
        want = pieces(attn, x, torch.arange(tokens))
        assert float((projected.q - want[1]).abs().max() / want[1].abs().max()) < 1e-5
    assert taken == [1, fast.LOOP_TOKENS]


def test_weights_given_new_storage_are_seen():
    """The loops read the weights' memory; a weight re-pointed to other storage (a reload) is
    read anew, each loop's every weight (the copies are made from the watched ones)."""
    attn = layer(torch.float32, number=SOURCES["ratio 2"])
    x, positions = torch.randn(1, attn.wq_a.in_features), torch.tensor([5])
    chunks, pending = Chunks.of([5], [1]), torch.randn(1, 2, attn.head_dim)
    o = torch.randn(1, attn.n_heads, attn.head_dim)

    def pairs():
        entries = fast.entry_rows(attn, x, chunks, pending), oracle_entries(attn, x, chunks, pending)
        return [
            *zip(fast.project_rows(attn, x, positions), pieces(attn, x, positions), strict=True),
            *zip(*entries, strict=True),
            (fast.output_rows(attn, o, positions), attn.project_out(o, positions)),
        ]

    pairs()
    kinds = [fast._QUERY, fast._ENTRY, fast._OUTPUT]
    assert [len(fast._watched(attn, names)) for names in kinds] == [len(names) for names in kinds]
    for name in {name for names in kinds for name in names}:
        module = attn.get_submodule(name)
        module.weight.data = module.weight.data * 1.5 + 0.25  # new storage, other values
    for got, want in pairs():
        if want is None or want.dtype == torch.int64:  # no new pending (an odd token); positions
            assert got is None if want is None else torch.equal(got, want)
            continue
        assert float((got.double() - want.double()).abs().max() / want.abs().max().clamp(min=1)) < 1e-5


def test_a_layer_too_large_for_the_loop_takes_the_pieces():
    """Each token reads every weight once in the loop: past LOOP_MACS a call (a real layer's
    sizes, or many tokens of a large one) the GEMMs of the pieces run."""
    attn = layer(torch.float32, {"hidden_size": 1024, "q_lora_rank": 512})
    per_token = sum(m.weight.numel() for m in (attn.wq_a, attn.wq_b, attn.wkv))
    fits = fast.LOOP_MACS // per_token
    assert 1 <= fits < fast.LOOP_TOKENS
    for tokens, taken in ((fits, True), (fits + 1, False)):
        got = fast.project_rows(attn, torch.randn(tokens, 1024), torch.arange(tokens))
        assert (got is not None) == taken


def test_linears_in_another_dtype_take_the_pieces():
    attn = layer(torch.float64)
    assert fast.project_rows(attn, torch.randn(1, attn.wq_a.in_features), torch.tensor([0])) is None


def oracle_entries(attn: Attention, x: torch.Tensor, chunks: Chunks, pending):
    latents, positions, new_pending = attn.compressor.compress(x, chunks, pending)
    key_rows = attn.indexer.rope(attn.indexer.k_norm(attn.indexer.wk(latents)), positions)
    return attn.rope(latents, positions), positions, key_rows, new_pending


# the TINY config's KV sources: the layer with compress ratio 2, the one with ratio 1
SOURCES = {"ratio 2": 2, "ratio 1": 4}


@pytest.mark.parametrize("source", SOURCES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("starts", [[301], [300], [300, 42], [7, 40, 2001, 0, 5]])
def test_a_decode_steps_entries_are_the_compressors(source, dtype, starts):
    """One token per request at odd and even positions: the pairs a ratio-2 source completes
    with its requests' pending tokens, the pending rows of those left unpaired; each entry's
    rotated latent and index key."""
    attn = layer(dtype, number=SOURCES[source])
    gen = torch.Generator().manual_seed(len(starts))
    chunks = Chunks.of(starts, [1] * len(starts))
    x = torch.randn(len(starts), attn.wq_a.in_features, generator=gen, dtype=dtype)
    pending = torch.randn(len(starts), 2, attn.head_dim, generator=gen, dtype=torch.float32)
    if all(start % 2 == 0 for start in starts):
        pending = None  # the store hands none when no request starts at an odd position
    got = fast.entry_rows(attn, x, chunks, pending)
    want = oracle_entries(attn, x, chunks, pending)
    tolerance = 1e-5 if dtype == torch.float32 else 1e-12
    assert torch.equal(got[1], want[1])
    for a, b in (got[0], want[0]), (got[2], want[2]):
        assert a.dtype == dtype and a.shape == b.shape
        assert a.numel() == 0 or float((a - b).abs().max() / b.abs().max()) < tolerance
    if want[3] is None:
        assert got[3] is None
    else:
        assert got[3].dtype == want[3].dtype
        assert float((got[3] - want[3]).abs().max() / want[3].abs().max()) < tolerance


def test_what_the_entry_loop_does_not_take_goes_to_the_compressor():
    """A ratio-2 chunk of more than one token, or an odd position without its pending token
    (the compressor refuses that by name), and too many tokens."""
    attn = layer(torch.float32, number=SOURCES["ratio 2"])
    x = torch.randn(2, attn.wq_a.in_features)
    assert fast.entry_rows(attn, x, Chunks.of([4], [2]), None) is None
    assert fast.entry_rows(attn, x[:1], Chunks.of([5], [1]), None) is None
    many = torch.randn(fast.LOOP_TOKENS + 1, attn.wq_a.in_features)
    ones = Chunks.of(list(range(0, 2 * len(many), 2)), [1] * len(many))
    assert fast.entry_rows(attn, many, ones, None) is None


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("tokens", [1, 3, fast.LOOP_TOKENS])
def test_the_output_loop_is_project_out(shape, dtype, tokens):
    """The attention's output rotated back per head, through each group's rows of wo_a and
    wo_b; a token's row the same bits alone as in its batch."""
    attn = layer(dtype, shape)
    gen = torch.Generator().manual_seed(tokens)
    o = torch.randn(tokens, attn.n_heads, attn.head_dim, generator=gen, dtype=dtype)
    positions = torch.randint(0, 5000, (tokens,), generator=gen)
    got, want = fast.output_rows(attn, o, positions), attn.project_out(o, positions)
    assert got.dtype == dtype and got.shape == want.shape
    assert float((got - want).abs().max() / want.abs().max()) < (1e-5 if dtype == torch.float32 else 1e-13)
    assert torch.equal(fast.output_rows(attn, o[-1:], positions[-1:])[0], got[-1])
    many = torch.randn(fast.LOOP_TOKENS + 1, *o.shape[1:], dtype=dtype)
    assert fast.output_rows(attn, many, torch.arange(len(many))) is None


def index_pieces(indexer, x: torch.Tensor, q_lora: torch.Tensor, positions: torch.Tensor):
    q = indexer.rope(indexer.wq_b(q_lora).unflatten(-1, (indexer.n_heads, indexer.head_dim)), positions)
    return q, indexer.weights_proj(x) * (indexer.head_dim**-0.5 * indexer.n_heads**-0.5)


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("tokens", [1, 4, fast.LOOP_TOKENS])
def test_the_index_query_loop_is_the_indexers_queries(shape, dtype, tokens):
    """An index source's queries per head, rotated (before their FP4 quantisation), and its head
    weights scaled in the model's dtype; a token's rows the same bits alone as in its batch;
    past LOOP_TOKENS, or with q_lora in another dtype, the pieces."""
    indexer = layer(dtype, shape, number=SOURCES["ratio 1"]).indexer
    gen = torch.Generator().manual_seed(tokens)
    x = torch.randn(tokens, indexer.weights_proj.in_features, generator=gen, dtype=dtype)
    q_lora = torch.randn(tokens, indexer.wq_b.in_features, generator=gen, dtype=dtype)
    positions = torch.randint(0, 5000, (tokens,), generator=gen)
    got, want = fast.index_rows(indexer, x, q_lora, positions), index_pieces(indexer, x, q_lora, positions)
    for a, b in zip(got, want, strict=True):
        assert a.dtype == dtype and a.shape == b.shape
        assert float((a - b).abs().max() / b.abs().max()) < (1e-5 if dtype == torch.float32 else 1e-13)
    alone = fast.index_rows(indexer, x[-1:], q_lora[-1:], positions[-1:])
    assert all(torch.equal(a[0], b[-1]) for a, b in zip(alone, got, strict=True))
    many = torch.randn(fast.LOOP_TOKENS + 1, x.shape[1], dtype=dtype)
    assert fast.index_rows(indexer, many, many[:, : q_lora.shape[1]], torch.arange(len(many))) is None
    assert fast.index_rows(indexer, x, q_lora.to(torch.float16), positions) is None


def test_the_index_weights_scale_rounds_as_torchs():
    """The head weights are the same bits as torch's when the linear's are (one input column:
    a single product each), where one float64 product rounded once differs."""
    indexer = layer(torch.float32, {"index_head_dim": 24}, number=SOURCES["ratio 1"]).indexer
    x = torch.zeros(fast.LOOP_TOKENS, indexer.weights_proj.in_features)
    x[:, 0] = torch.randn(fast.LOOP_TOKENS, generator=torch.Generator().manual_seed(0))
    q_lora = torch.randn(fast.LOOP_TOKENS, indexer.wq_b.in_features)
    got = fast.index_rows(indexer, x, q_lora, torch.arange(fast.LOOP_TOKENS))[1]
    scale = indexer.head_dim**-0.5 * indexer.n_heads**-0.5
    assert torch.equal(got, indexer.weights_proj(x) * scale)
    assert not torch.equal(got, (indexer.weights_proj(x).double() * scale).float())
