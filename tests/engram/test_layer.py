"""The Engram layer both runtimes build (`engram.layer.EngramLayer`): table rows, reduce, gate.

The reference keeps a whole table and reduces with the identity; a TP rank of the backend keeps
a row shard and sums the ranks' rows. Shards of one table summed are the whole table's rows, so
the layer's output is the same either way (two ranks in one process: the reduce adds the other
rank's rows, as the all-reduce would).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from sglang_ds41.config import V41Config
from sglang_ds41.engram.layer import EngramLayer
from sglang_ds41.engram.table import EngramTable
from sglang_ds41.errors import Ds41Error
from sglang_ds41.formats import quantize_fp8_rows

TINY = json.loads((Path(__file__).parents[1] / "fixtures" / "tiny_config.json").read_text())


@pytest.fixture(scope="module")
def cfg():
    return V41Config.from_dict(TINY).text


def table(rows: torch.Tensor, rank: int = 0, size: int = 1) -> EngramTable:
    values, scales = quantize_fp8_rows(rows)
    return EngramTable.from_tensors(values, scales, tp_rank=rank, tp_size=size, pin=False, head_dim=32)


def layer_with(cfg, reduce=None, seed: int = 0) -> EngramLayer:
    layer = EngramLayer(cfg, 1) if reduce is None else EngramLayer(cfg, 1, reduce)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in layer.parameters():
            p.copy_(torch.randn(p.shape, generator=gen) * 0.1)
    return layer


def test_parameter_names_are_the_checkpoints(cfg):
    names = sorted(n for n, _ in EngramLayer(cfg, 1).named_parameters())
    assert names == ["k_weight", "q_weight", "wkv.weight"]


def test_the_layer_is_the_gate_over_the_tables_rows(cfg):
    rows = torch.randn(434, 32, generator=torch.Generator().manual_seed(1))
    layer = layer_with(cfg)
    layer.table = table(rows)
    ids = torch.randint(0, 434, (5, 6), generator=torch.Generator().manual_seed(2))
    residual = torch.randn(5, 4, 64, generator=torch.Generator().manual_seed(3))
    image = torch.tensor([False, True, False, False, False])
    want = super(EngramLayer, layer).forward(residual, layer.table.lookup(ids), image)
    assert torch.equal(layer(residual, ids, image), want)
    assert torch.equal(layer(residual, ids, image)[1], residual[1])  # image rows stay


def test_a_row_shard_reduced_over_the_ranks_gives_the_whole_tables_layer(cfg):
    rows = torch.randn(434, 32, generator=torch.Generator().manual_seed(1))
    ids = torch.randint(0, 434, (7, 6), generator=torch.Generator().manual_seed(2))
    residual = torch.randn(7, 4, 64, generator=torch.Generator().manual_seed(3))
    whole = layer_with(cfg)
    whole.table = table(rows)
    other = table(rows, rank=1, size=2)
    shard = layer_with(cfg, reduce=lambda mine: (mine.float() + other.lookup(ids).float()).to(mine.dtype))
    shard.table = table(rows, rank=0, size=2)
    assert not torch.equal(shard.table.lookup(ids), whole.table.lookup(ids))  # each rank: part of the rows
    assert torch.equal(shard(residual, ids), whole(residual, ids))
    unreduced = layer_with(cfg)
    unreduced.table = shard.table
    assert not torch.equal(unreduced(residual, ids), whole(residual, ids))


def test_a_layer_without_its_table_is_an_error(cfg):
    with pytest.raises(Ds41Error, match="layer 1: Engram table not loaded"):
        EngramLayer(cfg, 1)(torch.zeros(1, 4, 64), torch.zeros(1, 6, dtype=torch.int64))
