"""Packing a checkpoint's tensors row-compactly and back, bit for bit."""

import gzip
from pathlib import Path

import pytest
import torch

from sglang_ds41 import formats
from sglang_ds41.checkpoint.bundle import pack, unpack
from sglang_ds41.errors import Ds41Error


def _tensors():
    g = torch.Generator().manual_seed(0)
    embed = torch.zeros(1000, 8, dtype=torch.bfloat16)
    embed[torch.tensor([3, 17, 999])] = torch.randn(3, 8, generator=g).bfloat16()
    rows = torch.zeros(500, 32)
    rows[torch.tensor([0, 250])] = torch.randn(2, 32, generator=g)
    values, scales = formats.quantize_fp8_rows(rows)  # FP8 rows: zero rows keep their own scale byte
    return {
        "embed.weight": embed,
        "head.weight": embed.clone(),
        "layers.1.engram.embed.weight": values,
        "layers.1.engram.embed.scale": scales,
        "norm.weight": torch.ones(8, dtype=torch.bfloat16),
        "scalar": torch.tensor(0.5),
        "mtp.0.w": torch.randn(4, 4, generator=g),
    }


def test_unpack_gives_back_every_tensor_bit_for_bit(tmp_path):
    tensors = _tensors()
    sparse = ["embed.weight", "head.weight", "layers.1.engram.embed.weight", "layers.1.engram.embed.scale"]
    layout = pack(tensors, sparse, tmp_path / "t.safetensors", regenerable=["mtp.0.w"])
    assert layout["head.weight"] == "same:embed.weight" and layout["embed.weight"].startswith("mask:")
    got = unpack(tmp_path / "t.safetensors", lambda: {"mtp.0.w": tensors["mtp.0.w"].clone()})
    assert got.keys() == tensors.keys()
    for name, t in tensors.items():
        assert got[name].dtype == t.dtype and got[name].shape == t.shape, name
        assert (
            torch.equal(got[name].view(torch.uint8), t.view(torch.uint8))
            if t.ndim
            else torch.equal(got[name], t)
        )
    # three embedding rows of a thousand are stored, not the thousand
    assert (tmp_path / "t.safetensors").stat().st_size < 4000


def test_a_table_with_nearly_every_row_used_is_kept_whole(tmp_path):
    # the trained model's Engram tables: its corpus hashed to all but a few rows, where a row
    # mask and the kept rows would be larger than the table itself
    g = torch.Generator().manual_seed(1)
    table = torch.randn(4096, 32, generator=g).to(torch.float8_e4m3fn)
    table[7] = 0
    layout = pack({"t": table}, ["t"], tmp_path / "t.safetensors")
    assert layout == {"t": "whole"}
    assert torch.equal(unpack(tmp_path / "t.safetensors")["t"].view(torch.uint8), table.view(torch.uint8))
    assert (tmp_path / "t.safetensors").stat().st_size < table.numel() + 1000


def test_a_regenerated_tensor_that_changed_is_refused_by_name(tmp_path):
    tensors = _tensors()
    pack(tensors, [], tmp_path / "t.safetensors", regenerable=["mtp.0.w"])
    with pytest.raises(Ds41Error, match=r"mtp\.0\.w.*changed since the model was packed"):
        unpack(tmp_path / "t.safetensors", lambda: {"mtp.0.w": tensors["mtp.0.w"] + 1})
    with pytest.raises(Ds41Error, match=r"no 'sglang_ds41\.bundle' metadata"):
        from safetensors.torch import save_file

        save_file({"x": torch.zeros(1)}, str(tmp_path / "plain.safetensors"))
        unpack(tmp_path / "plain.safetensors")


def test_a_gz_name_packs_compressed_and_unpacks_bit_for_bit(tmp_path):
    # BF16 rows repeat their exponent bytes: gzip takes a share of them, and the same tensors
    # give the same bytes (no timestamp in the stream)
    g = torch.Generator().manual_seed(2)
    tensors = {"embed.weight": (torch.randn(2000, 64, generator=g) * 0.02).bfloat16(),
               "scale": torch.ones(16, 1).to(torch.float8_e8m0fnu)}  # fmt: skip
    pack(tensors, [], tmp_path / "t.safetensors")
    pack(tensors, [], tmp_path / "t.safetensors.gz")
    pack(tensors, [], tmp_path / "again.safetensors.gz")
    size = {name: (tmp_path / name).stat().st_size for name in ("t.safetensors", "t.safetensors.gz")}
    assert size["t.safetensors.gz"] < 0.9 * size["t.safetensors"]
    assert (tmp_path / "t.safetensors.gz").read_bytes() == (tmp_path / "again.safetensors.gz").read_bytes()
    assert (tmp_path / "t.safetensors.gz").read_bytes()[4:8] == bytes(4)  # gzip's MTIME field: none
    got = unpack(tmp_path / "t.safetensors.gz")
    for name, t in tensors.items():
        assert got[name].dtype == t.dtype and torch.equal(got[name].view(torch.uint8), t.view(torch.uint8))
    assert not list(tmp_path.glob("*.partial"))


def test_a_failed_write_leaves_neither_file_nor_partial(tmp_path, monkeypatch):
    def refused(self, mode):  # after the partial file is written, before it is moved in place
        raise OSError(1, "Operation not permitted")

    monkeypatch.setattr(Path, "chmod", refused)
    with pytest.raises(OSError, match="not permitted"):
        pack({"x": torch.zeros(4, 4)}, [], tmp_path / "t.safetensors.gz")
    assert list(tmp_path.iterdir()) == []


def test_a_damaged_file_is_refused_by_name(tmp_path):
    pack({"x": torch.zeros(64, 64)}, [], tmp_path / "t.safetensors.gz")
    data = (tmp_path / "t.safetensors.gz").read_bytes()
    assert data[:2] == b"\x1f\x8b"
    damaged = {
        "cut": data[: len(data) // 2],  # the stream ends early
        "crc": data[:-8] + bytes(8),  # the trailer's checksum and length do not match
        "inside": gzip.compress(b"not safetensors"),  # a sound stream of something else
    }
    for name, content in damaged.items():
        (tmp_path / f"{name}.safetensors.gz").write_bytes(content)
        with pytest.raises(Ds41Error, match=rf"{name}\.safetensors\.gz: not a readable packed checkpoint"):
            unpack(tmp_path / f"{name}.safetensors.gz")
    with pytest.raises(Ds41Error, match=r"missing\.safetensors\.gz: not a readable packed checkpoint"):
        unpack(tmp_path / "missing.safetensors.gz")
