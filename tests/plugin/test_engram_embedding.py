"""Upstream SGLang's Engram layer, with our plugin, reads MXFP4 (and FP8) tables exactly as we do.

The oracle is the project's own `EngramTable` (tested against an independent float64
dequantisation in tests/engram/test_table.py) and, for the whole layer, `engram.gate.EngramGate`
(MODEL.md §5.6; tested against SGLang's gate in tests/engram/test_vs_sglang.py). Everything on
the upstream side is upstream's code: `Engram`, its `EngramLayout`, `shard_range`, the weight
loaders, `forward`; only the table class is ours, put there by `load_plugins()`.
"""

from __future__ import annotations

import json
import re
import shutil
from importlib.metadata import entry_points

import pytest
import torch

from sglang_ds41.engram.gate import EngramGate
from sglang_ds41.engram.table import EngramTable
from tests.plugin._upstream import checkpoint_tensor, load_table, serving, upstream_config

ENGRAM_LAYERS = (1, 2)  # the tiny config's Engram layers


def build_engram(upstream_engram, ckpt, layer: int, tp_size: int = 1, tp_rank: int = 0):
    config = upstream_config(ckpt)
    layout = upstream_engram.EngramLayout.from_config(config)
    with serving(ckpt, tp_size, tp_rank):
        engram = upstream_engram.Engram(config, layer, layout, prefix=f"model.layers.{layer}.engram")
    return engram, layout


def all_row_ids(layout, layer: int) -> torch.Tensor:
    """Every row of the layer's table, plus repeats, as upstream's [T, n_hash_cols] ids."""
    rows = layout.num_embeddings[layout.layer_ids.index(layer)]
    n_cols = (layout.max_ngram_size - 1) * layout.n_heads
    ids = torch.cat(
        [
            torch.arange(rows),
            torch.randint(0, rows, (n_cols * 7,), generator=torch.Generator().manual_seed(layer)),
        ]
    )
    return ids[: ids.numel() // n_cols * n_cols].view(-1, n_cols)


def test_load_plugins_installs_our_table_class(upstream_engram):
    from sglang_ds41.plugin.tables.embedding import Ds41EngramEmbedding

    assert "sglang_ds41" in {ep.name for ep in entry_points(group="sglang.srt.plugins")}
    assert upstream_engram.EngramEmbedding is Ds41EngramEmbedding
    assert issubclass(Ds41EngramEmbedding, Ds41EngramEmbedding.__mro__[1])
    assert Ds41EngramEmbedding.__mro__[1].__module__ == "sglang.srt.layers.engram"


@pytest.mark.parametrize("engram", ["mxfp4", "nvfp4", "fp8"])
@pytest.mark.parametrize(("tp_size", "tp_rank"), [(1, 0), (2, 0), (2, 1), (4, 0), (4, 1), (4, 2), (4, 3)])
def test_rank_lookup_equals_project_table_bit_for_bit(upstream_engram, tiny_ckpt, engram, tp_size, tp_rank):
    ckpt = tiny_ckpt(engram=engram)
    for layer in ENGRAM_LAYERS:
        module, layout = build_engram(upstream_engram, ckpt, layer, tp_size, tp_rank)
        embed = module.embed
        assert embed.table_format.name == engram
        expected_dtype = torch.float8_e4m3fn if engram == "fp8" else torch.uint8
        assert embed.weight.dtype == expected_dtype
        load_table(embed, ckpt, layer)
        ids = all_row_ids(layout, layer)
        ours = EngramTable.from_safetensors(
            ckpt, f"layers.{layer}.engram", column_starts=layout.column_bounds(layout.layer_ids.index(layer)),
            tp_rank=tp_rank, tp_size=tp_size, pin=False, head_dim=layout.head_dim,
        )  # fmt: skip
        assert (embed.row_start, embed.row_start + embed.rows) == (ours.shard.start, ours.shard.stop)
        got = embed._owned_rows(ids)  # what the rank contributes to the all-reduce
        want = ours.lookup(ids)
        assert torch.equal(got.view(torch.int16), want.view(torch.int16))
        owned = (ids >= ours.shard.start) & (ids < ours.shard.stop)
        assert bool((got[~owned] == 0).all()) and bool(owned.any())
        if tp_size == 1:  # no collective: upstream's whole forward path
            assert torch.equal(embed(ids).view(torch.int16), want.view(torch.int16))


@pytest.mark.parametrize("engram", ["mxfp4", "nvfp4"])
def test_third_party_int8_codes_load_as_the_same_bytes(upstream_engram, tiny_ckpt, engram):
    ckpt = tiny_ckpt(engram=engram)
    module, _ = build_engram(upstream_engram, ckpt, 1)
    load_table(module.embed, ckpt, 1, codes_dtype=torch.int8)
    assert torch.equal(module.embed.weight, checkpoint_tensor(ckpt, "layers.1.engram.embed.weight"))


def test_whole_upstream_engram_layer_equals_project_gate(upstream_engram, tiny_ckpt):
    """Upstream's Engram.forward (table + wkv + gate) vs the project's gate over the same rows."""
    from sglang_ds41.formats import dequantize_fp8_block2d

    ckpt = tiny_ckpt(engram="mxfp4")
    layer = 2
    before = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)  # the served dtype: upstream's wkv takes the default dtype
    try:
        module, layout = build_engram(upstream_engram, ckpt, layer)
    finally:
        torch.set_default_dtype(before)
    assert module.wkv.weight.dtype == torch.bfloat16
    load_table(module.embed, ckpt, layer)
    wkv = dequantize_fp8_block2d(
        checkpoint_tensor(ckpt, f"layers.{layer}.engram.wkv.weight"),
        checkpoint_tensor(ckpt, f"layers.{layer}.engram.wkv.scale"),
        dtype=torch.bfloat16,
    )
    module.wkv.weight.weight_loader(module.wkv.weight, wkv)
    for name in ("q_weight", "k_weight"):
        getattr(module, name).data.copy_(checkpoint_tensor(ckpt, f"layers.{layer}.engram.{name}"))

    config = json.loads((ckpt / "config.json").read_text())["text_config"]
    gate = EngramGate(
        config["hidden_size"], config["hc_mult"], module.wkv.weight.shape[1] // layout.head_dim,
        layout.head_dim, config["rms_norm_eps"], dtype=torch.bfloat16,
    )  # fmt: skip
    gate.wkv.weight.data.copy_(wkv)
    gate.q_weight.data.copy_(module.q_weight)
    gate.k_weight.data.copy_(module.k_weight)
    table = EngramTable.from_safetensors(
        ckpt,
        f"layers.{layer}.engram",
        column_starts=layout.column_bounds(1),
        pin=False,
        head_dim=layout.head_dim,
    )

    gen = torch.Generator().manual_seed(0)
    ids = all_row_ids(layout, layer)[:40]
    # the residual in fp32 so the comparison is not dominated by a final bf16 rounding
    x = torch.randn(ids.shape[0], config["hc_mult"], config["hidden_size"], generator=gen)
    input_ids = torch.randint(0, 1000, (ids.shape[0],), generator=gen)
    with serving(ckpt):
        got = module(x, ids, input_ids=input_ids)
    want = gate(x, table.lookup(ids))
    assert got.shape == want.shape == x.shape
    assert not torch.equal(got, x)  # the gate did update the residual
    torch.testing.assert_close(got, want, rtol=2e-6, atol=2e-6)


def _with_config(tmp_path, ckpt, quant_update: dict):
    """A copy of `ckpt` whose config declares other Engram formats (tensors unchanged)."""
    copy = tmp_path / "ckpt"
    shutil.copytree(ckpt, copy)
    config = json.loads((copy / "config.json").read_text())
    config["quantization_config"] = {
        k: v for k, v in config["quantization_config"].items() if not k.startswith("engram_embed")
    } | quant_update
    (copy / "config.json").write_text(json.dumps(config))
    return copy


@pytest.mark.parametrize(
    ("tensors", "declared", "problems"),
    [
        (
            "fp8",
            {"engram_embed_quant": "mxfp4", "engram_embed_block_size": 32},
            ["layers.1.engram.embed.weight: expected U8 or I8 [434, 16], found F8_E4M3 [434, 32]"],
        ),
        ("mxfp4", {}, ["layers.1.engram.embed.weight: expected F8_E4M3 [434, 32], found U8 [434, 16]"]),
        (
            "mxfp4",
            {"engram_embed_quant": "nvfp4", "engram_embed_block_size": 16},
            [
                "layers.1.engram.embed.weight_scale: missing (expected F8_E4M3 [434, 2])",
                "layers.1.engram.embed.weight_scale_2: missing (expected F32 [])",
                "layers.1.engram.embed.scale: not a tensor of NVFP4 tables",
            ],
        ),
    ],
)
def test_tables_that_contradict_the_config_fail_before_allocation_naming_each_tensor(
    upstream_engram, tiny_ckpt, tmp_path, tensors, declared, problems
):
    from sglang_ds41.plugin.tables.embedding import EngramFormatError

    ckpt = _with_config(tmp_path, tiny_ckpt(engram=tensors), declared)
    with pytest.raises(EngramFormatError) as error:
        build_engram(upstream_engram, ckpt, 1)
    message = str(error.value)
    assert (
        f"declares {(declared.get('engram_embed_quant') or 'fp8').upper()} Engram tables for layer 1"
        in message
    )
    for problem in problems:
        assert problem in message


@pytest.mark.parametrize(
    ("engram", "part", "bad", "found"),
    [
        ("mxfp4", "weight", torch.zeros(434, 32, dtype=torch.float8_e4m3fn), "found float8_e4m3fn [434, 32]"),
        ("mxfp4", "scale", torch.zeros(433, 1, dtype=torch.uint8), "found uint8 [433, 1]"),
        ("nvfp4", "weight_scale_2", torch.tensor(float("inf")), "found float32 [] = inf"),
        ("nvfp4", "weight_scale_2", torch.tensor([0.5, 0.5]), "found float32 [2]"),
    ],
)
def test_the_loader_also_checks_every_tensor_it_is_given(
    upstream_engram, tiny_ckpt, engram, part, bad, found
):
    """Tensors that reach the loader from elsewhere (a hub checkpoint: no headers read first)."""
    from sglang_ds41.plugin.tables.embedding import EngramFormatError

    module, _ = build_engram(upstream_engram, tiny_ckpt(engram=engram), 1)
    param = dict(module.embed.named_parameters())[part]
    with pytest.raises(EngramFormatError, match=rf"layers\.1\.engram\.embed\.{part}: .*{re.escape(found)}"):
        param.weight_loader(param, bad)


def test_partial_conversion_reads_each_layer_in_its_own_format(upstream_engram, tiny_ckpt, tmp_path):
    """`engram_embed_layers` lists the converted layers; the others stay FP8."""
    from safetensors.torch import load_file, save_file

    mx, fp8 = tiny_ckpt(engram="mxfp4"), tiny_ckpt(engram="fp8")
    ckpt = _with_config(tmp_path, mx, {"engram_embed_quant": "mxfp4", "engram_embed_layers": [2]})
    index = json.loads((ckpt / "model.safetensors.index.json").read_text())["weight_map"]
    for part in ("weight", "scale"):  # layer 1 back to its FP8 tensors
        name = f"layers.1.engram.embed.{part}"
        tensors = load_file(str(ckpt / index[name]))
        tensors[name] = checkpoint_tensor(fp8, name)
        save_file(tensors, str(ckpt / index[name]), metadata={"format": "pt"})
    # the process-wide format cache is keyed by path; this copy is new
    for layer, want in ((1, torch.float8_e4m3fn), (2, torch.uint8)):
        module, layout = build_engram(upstream_engram, ckpt, layer)
        assert module.embed.weight.dtype == want
        load_table(module.embed, ckpt, layer)
        ids = all_row_ids(layout, layer)
        ours = EngramTable.from_safetensors(
            ckpt, f"layers.{layer}.engram", column_starts=layout.column_bounds(layer - 1), pin=False,
            head_dim=layout.head_dim,
        )  # fmt: skip
        assert torch.equal(module.embed(ids).view(torch.int16), ours.lookup(ids).view(torch.int16))
