"""The shipped trained tiny model expands into the official layout, every tensor validated."""

import gzip
import json
import shutil

import pytest
import torch
from safetensors import safe_open

from sglang_ds41.checkpoint import trained
from sglang_ds41.checkpoint.bundle import unpack
from sglang_ds41.checkpoint.inspect import inspect_checkpoint
from sglang_ds41.checkpoint.reader import Checkpoint
from sglang_ds41.checkpoint.tiny import base_tensors
from sglang_ds41.reference.weights import load_reference

SHIPPED = trained.shipped_dir()


def test_the_shipped_model_is_small():
    size = sum((SHIPPED / name).stat().st_size for name in trained.SHIPPED_FILES)
    assert size <= 20 * 10**6, f"{size / 10**6:.1f} MB shipped"
    record = json.loads((SHIPPED / trained.TRAINING_FILE).read_text())
    assert record["settings"]["seed"] is not None and record["steps"] > 0


@pytest.mark.parametrize(("variant", "engram"), [("base", "fp8"), ("nvfp4", "mxfp4")])
def test_it_expands_into_a_valid_release_layout(tmp_path, variant, engram, one_torch_thread):
    out = trained.expand(tmp_path / "ckpt", variant=variant, engram=engram)
    Checkpoint.open(out).close()  # validates every tensor's name, dtype and shape against the manifest
    summary = inspect_checkpoint(out)
    assert summary["variant"] == variant
    config = json.loads((out / "config.json").read_text())
    assert config["text_config"]["hidden_size"] == 128 and config["text_config"]["vocab_size"] == 129280
    assert (out / "generation_config.json").is_file()
    model = load_reference(out, dtype=torch.float32)
    logits = model(torch.tensor([0, 128803, 100]), model.new_state())
    assert torch.isfinite(logits).all()


def test_the_base_expansion_is_the_packed_tensors_bit_for_bit(tmp_path):
    out = trained.expand(tmp_path / "ckpt")
    config = json.loads((out / "config.json").read_text())
    seed = json.loads((SHIPPED / trained.TRAINING_FILE).read_text())["settings"]["seed"]
    packed = unpack(SHIPPED / trained.TENSORS_FILE, lambda: base_tensors(seed, config["text_config"]))
    written = {}
    for shard in out.glob("*.safetensors"):
        with safe_open(str(shard), "pt") as f:
            written.update({name: f.get_tensor(name) for name in f.keys()})  # noqa: SIM118
    assert written.keys() == packed.keys()
    for name, t in packed.items():
        assert torch.equal(written[name].view(torch.uint8), t.view(torch.uint8)), name
    # the head and the embedding are the one trained matrix; rows the corpus never used are zero
    embed = written["embed.weight"]
    assert torch.equal(embed, written["head.weight"])
    used = int((embed != 0).any(dim=1).sum())
    assert 1000 < used < embed.shape[0] // 2


def test_a_bundle_packed_before_compression_still_expands(tmp_path):
    # bundles written by `train-tiny --bundle` before 2026-12-06 hold the uncompressed file
    for name in trained.SHIPPED_FILES:
        if name != trained.TENSORS_FILE:
            shutil.copy(SHIPPED / name, tmp_path / name)
    plain = gzip.decompress((SHIPPED / trained.TENSORS_FILE).read_bytes())
    (tmp_path / trained.UNCOMPRESSED_TENSORS_FILE).write_bytes(plain)
    old, shipped = trained.bundled_tensors(tmp_path), trained.bundled_tensors(SHIPPED)
    assert old.keys() == shipped.keys()
    for name, t in shipped.items():
        assert torch.equal(old[name].reshape(-1).view(torch.uint8), t.reshape(-1).view(torch.uint8)), name
