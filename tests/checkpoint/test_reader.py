"""Each way a checkpoint can be broken yields a `Ds41Error` naming the tensor/file and what was expected."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from sglang_ds41.checkpoint.reader import INDEX_FILE, Checkpoint, CheckpointError
from sglang_ds41.config import ConfigError
from sglang_ds41.errors import Ds41Error


def shard_of(ckpt: Path, name: str) -> str:
    return json.loads((ckpt / INDEX_FILE).read_text())["weight_map"][name]


def replace_file(path: Path, write: Callable[[Path], None]) -> None:
    """Replace a symlinked file by a real one (never touch the shared session checkpoint)."""
    path.unlink()
    write(path)


def edit_shard(ckpt: Path, file: str, edit: Callable[[dict[str, torch.Tensor]], None]) -> None:
    tensors = load_file(str(ckpt / file))
    edit(tensors)
    replace_file(ckpt / file, lambda p: save_file(tensors, str(p), metadata={"format": "pt"}))


def edit_json(path: Path, edit: Callable[[dict], None]) -> None:
    data = json.loads(path.read_text())
    edit(data)
    replace_file(path, lambda p: p.write_text(json.dumps(data)))


def open_error(ckpt: Path) -> str:
    with pytest.raises(Ds41Error) as info:
        Checkpoint.open(ckpt)
    return str(info.value)


def test_an_intact_tiny_checkpoint_opens_and_reads_tensors(tiny_dir):
    ckpt = Checkpoint.open(tiny_dir())
    sink = ckpt.tensor("layers.0.attn.attn_sink")
    assert sink.dtype == torch.float32 and sink.shape == (4,)
    assert ckpt.tensor("layers.0.attn.wq_a.scale").dtype == torch.float8_e8m0fnu
    assert ckpt.dense("layers.0.attn.wq_a").shape == (32, 64)
    assert ckpt.dense("layers.3.ffn.experts.7.w2").shape == (64, 32)


def test_missing_tensor_is_named_with_its_expected_layout(tiny_dir, clone):
    ckpt = clone(tiny_dir())
    name = "layers.3.attn.wq_a.scale"
    edit_shard(ckpt, shard_of(ckpt, name), lambda t: t.pop(name))
    edit_json(ckpt / INDEX_FILE, lambda d: d["weight_map"].pop(name))
    message = open_error(ckpt)
    assert f"missing tensor {name}" in message
    assert "F8_E8M0 [1, 2]" in message  # ceil(32/32) x ceil(64/32) blocks


def test_extra_tensor_is_named_with_its_shard(tiny_dir, clone):
    ckpt = clone(tiny_dir())
    file = shard_of(ckpt, "layers.0.attn.attn_sink")
    name = "layers.0.ffn.gate.tid2eid"  # a V4 tensor V4.1 does not have
    edit_shard(ckpt, file, lambda t: t.__setitem__(name, torch.zeros(4, 2, dtype=torch.int32)))
    edit_json(ckpt / INDEX_FILE, lambda d: d["weight_map"].__setitem__(name, file))
    message = open_error(ckpt)
    assert f"unexpected tensor {name}" in message and file in message


def test_wrong_shape_names_tensor_and_both_shapes(tiny_dir, clone):
    ckpt = clone(tiny_dir())
    name = "layers.2.attn.compressor.wgate.weight"
    edit_shard(ckpt, shard_of(ckpt, name), lambda t: t.__setitem__(name, t[name].T.contiguous()[:32]))
    message = open_error(ckpt)
    assert name in message
    assert "shape [32, 64], expected [64, 64]" in message


def test_wrong_dtype_names_tensor_and_both_dtypes(tiny_dir, clone):
    ckpt = clone(tiny_dir())
    name = "layers.5.attn.attn_sink"
    edit_shard(ckpt, shard_of(ckpt, name), lambda t: t.__setitem__(name, t[name].to(torch.bfloat16)))
    message = open_error(ckpt)
    assert name in message and "dtype BF16, expected F32" in message


def test_fp8_engram_tables_under_an_mxfp4_config_are_explained(tiny_dir, clone):
    ckpt = clone(tiny_dir("base", "fp8"))

    def declare_mxfp4(config: dict) -> None:
        config["quantization_config"]["engram_embed_quant"] = "mxfp4"

    edit_json(ckpt / "config.json", declare_mxfp4)
    message = open_error(ckpt)
    assert "layers.1.engram.embed.weight" in message
    assert "dtype F8_E4M3, expected U8" in message and "engram_embed_quant" in message


def test_missing_shard_is_named(tiny_dir, clone):
    ckpt = clone(tiny_dir())
    file = shard_of(ckpt, "layers.4.attn.wkv.weight")
    (ckpt / file).unlink()
    message = open_error(ckpt)
    assert f"missing shard {file}" in message
    assert "missing tensor" not in message  # the missing shard is the one explanation given
    assert message.count("\n") == 1


@pytest.mark.parametrize("keep", [4, 1000, -100])
def test_truncated_shard_is_named(tiny_dir, clone, keep):
    ckpt = clone(tiny_dir())
    file = shard_of(ckpt, "layers.6.attn.wkv.weight")
    data = (ckpt / file).read_bytes()
    replace_file(ckpt / file, lambda p: p.write_bytes(data[:keep]))
    message = open_error(ckpt)
    assert f"shard {file} is truncated" in message
    if keep == -100:  # the header is intact: the last tensor in the file is named
        assert "ends at byte" in message and f"the file has {len(data) - 100} bytes" in message


def test_a_shard_header_that_is_not_an_object_is_named_with_what_it_is(tiny_dir, clone):
    ckpt = clone(tiny_dir())
    file = shard_of(ckpt, "layers.6.attn.wkv.weight")
    header = b"[1, 2]"
    replace_file(ckpt / file, lambda p: p.write_bytes(len(header).to_bytes(8, "little") + header))
    assert f"shard {file}: header must be a JSON object, got list" in open_error(ckpt)


def test_an_index_naming_a_shard_by_a_number_says_which_tensor(tiny_dir, clone):
    ckpt = clone(tiny_dir())
    name = "layers.0.attn.wkv.weight"
    edit_json(ckpt / INDEX_FILE, lambda d: d["weight_map"].__setitem__(name, 3))
    assert f"got int 3 as the file of {name}" in open_error(ckpt)


def test_index_pointing_to_the_wrong_shard_is_reported(tiny_dir, clone):
    ckpt = clone(tiny_dir())
    name = "layers.0.attn.wkv.weight"
    right = shard_of(ckpt, name)
    wrong = shard_of(ckpt, "layers.7.attn.wkv.weight")
    edit_json(ckpt / INDEX_FILE, lambda d: d["weight_map"].__setitem__(name, wrong))
    message = open_error(ckpt)
    assert f"tensor {name} is in shard {right} but {INDEX_FILE} places it in {wrong}" in message


def test_index_total_size_must_match_the_shards(tiny_dir, clone):
    ckpt = clone(tiny_dir())
    edit_json(ckpt / INDEX_FILE, lambda d: d["metadata"].__setitem__("total_size", 123))
    assert "metadata.total_size = 123" in open_error(ckpt)


@pytest.mark.parametrize(
    ("edit", "needle"),
    [
        (
            lambda c: c["text_config"].__setitem__("engram_num_embeddings", [434, 607]),
            "engram_num_embeddings",
        ),
        (
            lambda c: c["text_config"].__setitem__("compress_ratios", [0, 0, 2, 2, 1, 1, 1, 1]),
            "compress_ratios",
        ),
        (lambda c: c["text_config"].__setitem__("kv_source_layer_ids", [3, 4]), "kv_source_layer_ids"),
        (lambda c: c["text_config"].__setitem__("moe_intermediate_size", 48), "moe_intermediate_size"),
        (
            lambda c: c["quantization_config"].__setitem__("weight_block_size", [128, 128]),
            "weight_block_size",
        ),
        (lambda c: c["text_config"].pop("hidden_size"), "hidden_size"),
    ],
)
def test_self_contradictory_config_is_refused_naming_the_field(tiny_dir, clone, edit, needle):
    ckpt = clone(tiny_dir())
    edit_json(ckpt / "config.json", edit)
    with pytest.raises(ConfigError, match=needle):
        Checkpoint.open(ckpt)


def test_config_and_hf_quant_config_must_agree(tiny_dir, clone):
    ckpt = clone(tiny_dir("nvfp4", "fp8"))
    edit_json(
        ckpt / "hf_quant_config.json",
        lambda d: d["quantization"]["quantized_layers"].pop("layers.0.ffn.experts"),
    )
    with pytest.raises(ConfigError, match=r"hf_quant_config\.json") as info:
        Checkpoint.open(ckpt)
    assert "quantized_layers" in str(info.value)


def test_nvfp4_fields_only_in_hf_quant_config_are_honoured(tiny_dir, clone):
    ckpt = clone(tiny_dir("nvfp4", "fp8"))
    nv_keys = ("quant_algo", "moe_quant_algo", "group_size", "kv_cache_quant_algo", "ignore", "producer",
               "quantized_layers", "config_groups")  # fmt: skip

    def strip(config: dict) -> None:
        for key in nv_keys:
            config["quantization_config"].pop(key)

    edit_json(ckpt / "config.json", strip)
    assert Checkpoint.open(ckpt).manifest.variant == "nvfp4"


def test_many_problems_are_listed_with_a_count(tiny_dir, clone):
    ckpt = clone(tiny_dir())
    edit_json(ckpt / "config.json", lambda c: c["text_config"].__setitem__("n_routed_experts", 4))
    message = open_error(ckpt)
    assert "tensor layers.0.ffn.gate.weight in shard" in message
    assert "shape [8, 64], expected [4, 64]" in message
    n_unexpected = 8 * 4 * 3 * 2  # layers x experts 4..7 x (w1, w2, w3) x (weight, scale)
    assert f"({n_unexpected + 8 * 3} problems)" in message  # + gate weight/bias/bias_vl per layer
    assert f"... and {n_unexpected + 8 * 3 - 20} more" in message


def test_not_a_checkpoint_directory(tmp_path):
    with pytest.raises(CheckpointError, match=r"no config\.json"):
        Checkpoint.open(tmp_path)
