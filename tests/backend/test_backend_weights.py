"""Weight loading of the backend through the shared reader: names, sharding, errors."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from sglang_ds41.backend.model import DeepseekV41ForCausalLM
from sglang_ds41.backend.tp import TensorParallel
from sglang_ds41.backend.weights import backend_checkpoint_name, load_checkpoint
from sglang_ds41.checkpoint.reader import CheckpointError


def test_backend_parameter_names_map_to_the_official_names():
    assert backend_checkpoint_name("model.layers.3.hc_attn.fn") == "layers.3.hc_attn_fn"
    assert backend_checkpoint_name("model.layers.2.attn.compressor.wgate.weight") == (
        "layers.2.attn.compressor.wgate.weight"
    )
    assert backend_checkpoint_name("model.embed.weight") == "embed.weight"
    assert backend_checkpoint_name("head.weight") == "head.weight"


def test_a_parameter_without_a_checkpoint_tensor_is_named(ckpt):
    module = nn.Module()
    module.register_parameter("bogus", nn.Parameter(torch.zeros(3)))
    with pytest.raises(CheckpointError, match="bogus"):
        load_checkpoint(module, ckpt, torch.float32, {})


def test_a_shape_mismatch_names_the_tensor(ckpt):
    module = nn.Module()
    module.head = nn.Linear(3, 5, bias=False)
    with pytest.raises(CheckpointError, match=r"head\.weight.*\[5, 3\]"):
        load_checkpoint(module, ckpt, torch.float32, {})


def test_unused_language_model_tensors_are_reported(ckpt):
    module = nn.Module()
    module.head = nn.Linear(64, 129280, bias=False)
    with pytest.raises(CheckpointError, match="not used by the backend"):
        load_checkpoint(module, ckpt, torch.float32, {})


def test_tp_ranks_split_every_engram_table_and_their_lookups_add_up(ckpt):
    ranks = [
        DeepseekV41ForCausalLM.for_checkpoint(ckpt, torch.float32, tp=TensorParallel(r, 2)) for r in (0, 1)
    ]
    whole = DeepseekV41ForCausalLM.for_checkpoint(ckpt, torch.float32)
    for layer in (1, 2):
        tables = [m.model.layers[layer].engram.table for m in ranks]
        full = whole.model.layers[layer].engram.table
        assert tables[0].shard.stop == tables[1].shard.start and tables[1].shard.stop == full.num_rows
        assert tables[0].nbytes + tables[1].nbytes == full.nbytes
        ids = torch.arange(full.num_rows).reshape(-1, 2)
        summed = tables[0].lookup(ids).float() + tables[1].lookup(ids).float()
        assert torch.equal(summed, full.lookup(ids).float())
