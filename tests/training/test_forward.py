"""The trainer's batched forward is the reference model's forward, with gradients."""

import random
from dataclasses import replace

import pytest
import torch

from sglang_ds41.config import V41Config
from sglang_ds41.engram.hashing import EngramHasher
from sglang_ds41.reference.model import Transformer
from sglang_ds41.reference.weights import load_reference
from sglang_ds41.training.config import trained_config
from sglang_ds41.training.forward import (
    Batch,
    EngramTables,
    forward_hidden,
    length_groups,
    sees_everything,
)
from sglang_ds41.training.quant import fp8_rows

pytestmark = pytest.mark.usefixtures("one_torch_thread")


class _FloatTable:
    """A whole float table where the reference expects an `EngramTable`."""

    def __init__(self, rows: torch.Tensor):
        self.rows = rows

    def lookup(self, row_ids: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.embedding(row_ids, self.rows)


def _tables_of(model: Transformer) -> EngramTables:
    """The reference's Engram tables as the trainer's float parameters (rows dequantised)."""
    t = model.text
    tables = EngramTables(tuple(t.engram_layer_ids), tuple(t.engram_num_embeddings), t.engram_head_dim)
    for layer, param in zip(t.engram_layer_ids, tables.tables, strict=True):
        rows = torch.arange(param.shape[0])[:, None]
        param.data = model.layers[layer].engram.table.lookup(rows).reshape(param.shape).to(model.dtype)
    return tables.to(model.dtype)


def _batch(model: Transformer, lengths: list[int], seed: int = 0) -> tuple[Batch, list[torch.Tensor]]:
    g = torch.Generator().manual_seed(seed)
    seqs = [torch.randint(3, 129000, (n,), generator=g) for n in lengths]
    ids = torch.cat(seqs)
    rows = torch.cat([model.hasher.hash_sequence(s) for s in seqs])
    return Batch(ids, torch.tensor(lengths), rows, ids), seqs


def _check_against_reference(model: Transformer, tables: EngramTables, lengths: list[int]) -> None:
    batch, seqs = _batch(model, lengths)
    with torch.no_grad():
        logits = torch.nn.functional.linear(forward_hidden(model, tables, batch), model.head.weight)
    start = 0
    for s in seqs:
        expected = model(s, model.new_state())
        got = logits[start : start + len(s)]
        start += len(s)
        assert (got - expected).abs().max() <= 1e-10 * expected.abs().max(), len(s)


def test_a_batch_of_sequences_equals_the_reference_one_by_one_with_top_k_selection(ckpt):
    # Today's tiny checkpoint keeps 4 entries of up to ~40: the indexer's selection is used.
    model = load_reference(ckpt, dtype=torch.float64)
    batch, _ = _batch(model, [37, 61, 50])
    assert not any(
        sees_everything(b.attn, batch.chunks) for b in model.layers if b.attn.role.name != "WINDOW"
    )
    _check_against_reference(model, _tables_of(model), [37, 61, 50])


def test_a_batch_equals_the_reference_when_every_entry_is_seen(ckpt):
    # The trained model's shape: a 128-token window and a top-k above every sequence length, so
    # the blocked attention without selection runs (several 128-row blocks, odd lengths).
    config = V41Config.from_dict(trained_config(text={"hidden_size": 64, "moe_intermediate_size": 32}))
    hasher = EngramHasher.for_tokenizer(config, ckpt / "tokenizer.json")
    model = Transformer(config, hasher)
    g = torch.Generator().manual_seed(1)
    for p in model.parameters():
        p.data = torch.randn(p.shape, generator=g) * (p.shape[-1] ** -0.5 if p.ndim == 2 else 0.3)
    model = model.double().requires_grad_(False)
    tables = EngramTables(
        tuple(config.text.engram_layer_ids), tuple(config.text.engram_num_embeddings), 32
    ).double()
    for p in tables.parameters():  # the trainer reads its tables as FP8 rows: give it FP8 rows
        p.data = fp8_rows(p.data.normal_(generator=g))
    for layer, p in zip(config.text.engram_layer_ids, tables.tables, strict=True):
        model.layers[layer].engram.table = _FloatTable(p.data)
    # Runs of one to two sequences of 1, 2 or 3 query blocks: attended run by run.
    lengths = [300, 129, 200, 7, 250, 5]
    batch, _ = _batch(model, lengths)
    groups = length_groups(model.layers[4].attn, batch.chunks)
    assert [int(g.lengths.sum()) for g, _, _ in groups] == [300, 329, 7, 250, 5]
    assert all(sees_everything(b.attn, batch.chunks) for b in model.layers)
    _check_against_reference(model, tables, lengths)


def test_sorting_a_batch_by_length_moves_whole_sequences(ckpt):
    model = load_reference(ckpt, dtype=torch.float32)
    batch, seqs = _batch(model, [40, 9, 23, 9])
    batch = replace(batch, targets=batch.targets + 1)
    sorted_ = batch.by_length()
    assert sorted_.lengths.tolist() == [9, 9, 23, 40]
    order = [1, 3, 2, 0]  # stable: the first 9 stays first
    assert torch.equal(sorted_.ids, torch.cat([seqs[i] for i in order]))
    assert torch.equal(sorted_.targets, sorted_.ids + 1)
    assert torch.equal(sorted_.engram_rows, torch.cat([model.hasher.hash_sequence(seqs[i]) for i in order]))


def test_every_trained_parameter_gets_a_gradient(ckpt):
    model = load_reference(ckpt, dtype=torch.float32).requires_grad_(True)
    tables = _tables_of(model).requires_grad_(True)
    batch, _ = _batch(model, [40, 23], seed=random.Random(0).randint(0, 99))
    forward_hidden(model, tables, batch).square().mean().backward()
    # Not learnt by gradients: the router's selection biases (moved by load, not by the loss),
    # the image span embeddings (no image here) and the head (the trainer ties it to the embedding).
    skipped = ("gate.bias", "gate.bias_vl", "image_start", "image_newline", "image_end", "head.weight")
    missing = [
        n
        for n, p in model.named_parameters()
        if not n.endswith(skipped) and (p.grad is None or not p.grad.any())
    ]
    # The indexers of the tiny checkpoint choose top-k (no gradient through a selection).
    missing = [n for n in missing if ".indexer." not in n]
    assert not missing
    assert all(t.grad is not None and t.grad.any() for t in tables.tables)
