"""Engram table store: format detection, safetensors loading, gather + dequant, TP row shards
(FP8, MXFP4 and NVFP4 tables; U8 and I8 codes)."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest
import torch
from safetensors.torch import save_file

from sglang_ds41.engram import table as table_mod
from sglang_ds41.engram.table import EngramTable, EngramTableError, row_shard, shard_boundaries
from sglang_ds41.errors import Ds41Error
from sglang_ds41.formats.engram import ENGRAM_FORMATS, FP8, MXFP4, NVFP4, EngramFormat

PREFIX = "layers.1.engram"
W, S = f"{PREFIX}.embed.weight", f"{PREFIX}.embed.scale"
WS, WS2 = f"{PREFIX}.embed.weight_scale", f"{PREFIX}.embed.weight_scale_2"

# MODEL.md Appendix B, TINY layer 1: primes [61, 67, 71, 73, 79, 83] -> column boundaries
TINY_STARTS = [0, 61, 128, 199, 272, 351, 434]
# MODEL.md Appendix A, official layer 1 offsets (+ total rows)
OFFICIAL_STARTS = [
    0, 16000057, 32000136, 48000217, 64000314, 80000435, 96000564, 112000697, 128000880, 144001069,
    160001276, 176001487, 192001740, 208002017, 224002306, 240002613, 256002934, 272003273, 288003654,
    304004047, 320004446, 336004849, 352005258, 368005705, 384006168,
]  # fmt: skip

E2M1 = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0]


def random_table(quant: EngramFormat, rows: int, head_dim: int = 256, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    scale = torch.randint(110, 140, (rows, head_dim // 32), generator=gen, dtype=torch.uint8)
    if quant is FP8:
        weight = (torch.randn(rows, head_dim, generator=gen) * 40).to(torch.float8_e4m3fn)
    else:
        weight = torch.randint(0, 256, (rows, head_dim // 2), generator=gen, dtype=torch.uint8)
    return weight, scale.view(torch.float8_e8m0fnu)


def oracle(weight: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """Spec §5.6 / §8.2 dequantisation in float64, written independently of gather.py."""
    pow2 = torch.pow(2.0, scale.view(torch.uint8).to(torch.float64) - 127)  # [rows, blocks]
    if weight.dtype == torch.float8_e4m3fn:
        values = weight.to(torch.float64)
    else:
        b = weight.view(torch.uint8).to(torch.int64)
        nibbles = torch.stack([b & 15, b >> 4], dim=-1).reshape(b.shape[0], -1)  # low nibble = even column
        lut = torch.tensor(E2M1 + [-v for v in E2M1], dtype=torch.float64)
        values = lut[nibbles]
    rows, width = values.shape
    return (values.view(rows, -1, 32) * pow2[:, :, None]).view(rows, width).to(torch.bfloat16)


def random_nvfp4_table(rows: int, head_dim: int = 256, seed: int = 0, global_scale: float = 0.0123):
    """Random codes, positive finite E4M3 block scales, a float32 global scale."""
    gen = torch.Generator().manual_seed(seed)
    codes = torch.randint(0, 256, (rows, head_dim // 2), generator=gen, dtype=torch.uint8)
    scale = torch.randint(0, 0x7F, (rows, head_dim // 16), generator=gen, dtype=torch.uint8)
    return codes, scale.view(torch.float8_e4m3fn), torch.tensor(global_scale, dtype=torch.float32)


def nvfp4_oracle(codes: torch.Tensor, scale: torch.Tensor, global_scale: torch.Tensor) -> torch.Tensor:
    """ModelOpt's NVFP4 decode, per value in float32 (E4M3 from its bits, written here): the two
    scales multiplied first, then the E2M1 value; then bf16."""
    b = scale.view(torch.uint8).to(torch.int64)
    e, m = (b >> 3) & 15, b & 7
    e4m3 = torch.where(e == 0, m * 2.0**-9, (1 + m / 8) * torch.pow(2.0, e - 7)).float()
    block = e4m3 * global_scale.float()  # float32 product
    c = codes.view(torch.uint8).to(torch.int64)
    nibbles = torch.stack([c & 15, c >> 4], dim=-1).reshape(c.shape[0], -1)
    values = torch.tensor(E2M1 + [-v for v in E2M1], dtype=torch.float32)[nibbles]
    rows, width = values.shape
    return (values.view(rows, -1, 16) * block[:, :, None]).view(rows, width).to(torch.bfloat16)


def table_tensors(
    quant: EngramFormat, rows: int, head_dim: int = 256, seed: int = 0
) -> dict[str, torch.Tensor]:
    """A random table's checkpoint tensors under their names."""
    if quant is NVFP4:
        codes, scale, ws2 = random_nvfp4_table(rows, head_dim, seed)
        return {W: codes, WS: scale, WS2: ws2}
    weight, scale = random_table(quant, rows, head_dim, seed)
    return {W: weight, S: scale}


def tensors_oracle(tensors: dict[str, torch.Tensor]) -> torch.Tensor:
    if WS in tensors:
        return nvfp4_oracle(tensors[W], tensors[WS], tensors[WS2])
    return oracle(tensors[W], tensors[S])


def write(path, tensors):
    save_file(tensors, str(path))
    return path


# ---- format detection -------------------------------------------------------------------


@pytest.mark.parametrize("quant", list(ENGRAM_FORMATS.values()), ids=list(ENGRAM_FORMATS))
def test_lookup_equals_independent_dequantisation(tmp_path, quant):
    tensors = table_tensors(quant, 434)
    table = EngramTable.from_safetensors(write(tmp_path / "t.safetensors", tensors), PREFIX)
    assert table.fmt.format is quant
    assert table.fmt.row_bytes == {FP8: 264, MXFP4: 136, NVFP4: 144}[quant]
    assert set(table.tensor_names) == set(tensors)
    ids = torch.randint(0, 434, (3, 7, 24))
    got = table.lookup(ids)
    assert got.dtype == torch.bfloat16 and got.shape == (3, 7, 24, 256)
    assert torch.equal(got, tensors_oracle(tensors)[ids])


def test_nvfp4_lookup_agrees_with_formats_package_and_its_global_scale_may_be_1d(tmp_path):
    from sglang_ds41.formats import dequantize_nvfp4

    codes, scale, ws2 = random_nvfp4_table(61, seed=8, global_scale=3.1e-5)
    want = dequantize_nvfp4(codes, scale, ws2, dtype=torch.bfloat16)
    table = EngramTable.from_tensors(codes, scale, global_scale=ws2)
    assert torch.equal(table.lookup(torch.arange(61)), want)
    path = write(tmp_path / "t.safetensors", {W: codes.view(torch.int8), WS: scale, WS2: ws2.reshape(1)})
    table = EngramTable.from_safetensors(path, PREFIX)  # I8 codes, [1]-shaped global scale
    assert table.fmt.global_scale == ws2.item()
    assert torch.equal(table.lookup(torch.arange(61)), want)


def test_hand_computed_nvfp4_row():
    # codes 0x9A -> -1.0 (col 0), -0.5 (col 1); scale byte 0x40 = 2.0 (cols 0-15), 0x30 = 0.5
    # (cols 16-31); global 0.25: block scales 0.5 and 0.125. Byte 8 = 0x7F -> -6, +6 -> x0.125.
    codes = torch.zeros(1, 16, dtype=torch.uint8)
    codes[0, 0], codes[0, 8] = 0x9A, 0x7F
    scale = torch.tensor([[0x40, 0x30]], dtype=torch.uint8).view(torch.float8_e4m3fn)
    row = EngramTable.from_tensors(codes, scale, head_dim=32, global_scale=0.25).lookup(torch.tensor([0]))[0]
    assert row[:2].tolist() == [-0.5, -0.25] and row[16:18].tolist() == [-0.75, 0.75]
    assert not row[2:16].any() and not row[18:].any()


def test_lookup_agrees_with_formats_package():
    mxfp4 = pytest.importorskip("sglang_ds41.formats.mxfp4")
    weight, scale = random_table(MXFP4, 50, seed=3)
    table = EngramTable.from_tensors(weight, scale)
    want = mxfp4.dequantize_mxfp4(weight, scale, dtype=torch.bfloat16)
    assert torch.equal(table.lookup(torch.arange(50)), want)


def test_fp8_lookup_agrees_with_formats_package():
    fp8 = pytest.importorskip("sglang_ds41.formats.fp8")
    weight, scale = random_table(FP8, 50, seed=4)
    table = EngramTable.from_tensors(weight, scale)
    want = fp8.dequantize_fp8_rows(weight, scale, block=32, dtype=torch.bfloat16)
    assert torch.equal(table.lookup(torch.arange(50)), want)


def test_signed_int8_codes_are_accepted(tmp_path):
    weight, scale = random_table(MXFP4, 61)
    path = write(tmp_path / "t.safetensors", {W: weight.view(torch.int8), S: scale})
    table = EngramTable.from_safetensors(path, PREFIX)
    assert torch.equal(table.lookup(torch.arange(61)), oracle(weight, scale))


def test_hand_computed_mxfp4_row():
    # one 32-column row: byte 0x9A -> low nibble 0xA = -1.0 (col 0), high 0x9 = -0.5 (col 1);
    # byte 0x7F -> 0xF = -6 (col 2), 0x7 = +6 (col 3); scale 2**(130-127) = 8
    codes = torch.zeros(1, 16, dtype=torch.uint8)
    codes[0, 0], codes[0, 1] = 0x9A, 0x7F
    scale = torch.tensor([[130]], dtype=torch.uint8).view(torch.float8_e8m0fnu)
    row = EngramTable.from_tensors(codes, scale, head_dim=32).lookup(torch.tensor([0]))[0]
    assert row[:4].tolist() == [-8.0, -4.0, -48.0, 48.0]
    assert not row[4:].any()


def test_tiny_head_dim_tables(tmp_path):
    for quant in ENGRAM_FORMATS.values():
        tensors = table_tensors(quant, 434, head_dim=32, seed=5)
        path = write(tmp_path / f"{quant.name}.safetensors", tensors)
        table = EngramTable.from_safetensors(path, PREFIX, TINY_STARTS, head_dim=32)
        assert torch.equal(table.lookup(torch.arange(434)), tensors_oracle(tensors))


@pytest.mark.parametrize(
    ("weight", "fragment"),
    [
        (torch.zeros(8, 256, dtype=torch.bfloat16), "BF16"),
        (torch.zeros(8, 256, dtype=torch.uint8), "U8 [8, 256]"),
        (torch.zeros(8, 128).to(torch.float8_e4m3fn), "F8_E4M3 [8, 128]"),
        (torch.zeros(8, 64, dtype=torch.uint8), "U8 [8, 64]"),
    ],
)
def test_bad_weight_format_names_the_tensor(tmp_path, weight, fragment):
    scale = torch.zeros(8, 8, dtype=torch.uint8).view(torch.float8_e8m0fnu)
    path = write(tmp_path / "t.safetensors", {W: weight, S: scale})
    with pytest.raises(Ds41Error) as err:
        EngramTable.from_safetensors(path, PREFIX)
    assert W in str(err.value) and fragment in str(err.value)


def test_bad_scale_names_the_scale_tensor(tmp_path):
    weight, _ = random_table(MXFP4, 8)
    path = write(tmp_path / "t.safetensors", {W: weight, S: torch.zeros(8, 4, dtype=torch.float32)})
    with pytest.raises(EngramTableError, match=r"layers\.1\.engram\.embed\.scale.*F32 \[8, 4\]"):
        EngramTable.from_safetensors(path, PREFIX)


def test_missing_and_incomplete_tables_fail_clearly(tmp_path):
    codes, scale, ws2 = random_nvfp4_table(8)
    half = write(tmp_path / "half.safetensors", {W: codes, WS: scale})
    with pytest.raises(EngramTableError, match=r"weight_scale_2' not found .*: an NVFP4 table needs it"):
        EngramTable.from_safetensors(half, PREFIX)
    with pytest.raises(EngramTableError, match=r"layers\.14\.engram\.embed\.weight"):
        EngramTable.from_safetensors(half, "layers.14.engram")
    only_weight = write(tmp_path / "w.safetensors", {W: codes})
    with pytest.raises(EngramTableError, match=r"embed\.scale' \(FP8, MXFP4\) or .*_2' \(NVFP4\)"):
        EngramTable.from_safetensors(only_weight, PREFIX)
    mx_scale = torch.zeros(8, 8, dtype=torch.uint8)
    both = write(tmp_path / "both.safetensors", {W: codes, S: mx_scale, WS: scale, WS2: ws2})
    with pytest.raises(EngramTableError, match="both an MXFP4/FP8 scale"):
        EngramTable.from_safetensors(both, PREFIX)


@pytest.mark.parametrize(
    ("tensors", "fragment"),
    [
        ({WS2: torch.tensor(0.5, dtype=torch.bfloat16)}, r"_scale_2'.*expected F32 \[\].*got BF16 \[\]"),
        ({WS2: torch.ones(2)}, r"weight_scale_2'.*got F32 \[2\]"),
        ({WS2: torch.tensor(float("inf"))}, r"weight_scale_2'.*finite float32 global scale .*got inf"),
        (
            {WS: torch.zeros(8, 8).to(torch.float8_e4m3fn)},
            r"weight_scale'.*expected F8_E4M3 \[8, 16\].*got F8_E4M3 \[8, 8\]",
        ),
    ],
)
def test_bad_nvfp4_scales_name_the_tensor(tmp_path, tensors, fragment):
    codes, scale, ws2 = random_nvfp4_table(8)
    path = write(tmp_path / "t.safetensors", {W: codes, WS: scale, WS2: ws2} | tensors)
    with pytest.raises(EngramTableError, match=fragment):
        EngramTable.from_safetensors(path, PREFIX)


def test_out_of_range_ids_fail():
    table = EngramTable.from_tensors(*random_table(FP8, 10))
    for bad in (10, -1):
        with pytest.raises(EngramTableError, match=r"0\.\.9"):
            table.lookup(torch.tensor([0, bad]))


def test_tensors_split_over_files_and_index_json(tmp_path):
    weight, scale = random_table(FP8, 100, seed=6)
    write(tmp_path / "model-00001.safetensors", {W: weight})
    write(tmp_path / "model-00002.safetensors", {S: scale, "other": torch.zeros(1)})
    want = oracle(weight, scale)
    files = [tmp_path / "model-00001.safetensors", tmp_path / "model-00002.safetensors"]
    assert torch.equal(EngramTable.from_safetensors(files, PREFIX).lookup(torch.arange(100)), want)
    assert torch.equal(EngramTable.from_safetensors(tmp_path, PREFIX).lookup(torch.arange(100)), want)
    index = {"metadata": {}, "weight_map": {W: "model-00001.safetensors", S: "model-00002.safetensors"}}
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps(index))
    assert torch.equal(EngramTable.from_safetensors(tmp_path, PREFIX).lookup(torch.arange(100)), want)


# ---- TP sharding ------------------------------------------------------------------------


def test_official_shards_follow_section_9_2():
    # 24 columns: tp 2/3/4/8 split on column boundaries; tp 5 does not divide 24 -> equal rows
    rows = OFFICIAL_STARTS[-1]
    assert shard_boundaries(rows, 2, OFFICIAL_STARTS) == [0, 192001740, rows]
    assert row_shard(rows, 1, 2, OFFICIAL_STARTS).num_rows == 192004428
    assert row_shard(rows, 0, 4, OFFICIAL_STARTS).num_rows == 96000564
    assert shard_boundaries(rows, 8, OFFICIAL_STARTS) == OFFICIAL_STARTS[::3]
    assert shard_boundaries(rows, 3, OFFICIAL_STARTS) == OFFICIAL_STARTS[::8]
    assert shard_boundaries(rows, 5, OFFICIAL_STARTS) == [rows * r // 5 for r in range(6)]


@pytest.mark.parametrize("quant", list(ENGRAM_FORMATS.values()), ids=list(ENGRAM_FORMATS))
@pytest.mark.parametrize("tp", [1, 2, 3, 4, 8])
def test_tp_shards_partition_rows_and_sum_exactly(tmp_path, quant, tp):
    path = write(tmp_path / "t.safetensors", table_tensors(quant, 434, seed=tp))
    ids = torch.cat([torch.arange(434), torch.randint(0, 434, (200,))]).view(2, -1)
    full = EngramTable.from_safetensors(path, PREFIX, TINY_STARTS).lookup(ids)
    shards = [EngramTable.from_safetensors(path, PREFIX, TINY_STARTS, r, tp) for r in range(tp)]

    owners = torch.stack([s.owns(torch.arange(434)) for s in shards]).sum(0)
    assert torch.equal(owners, torch.ones(434, dtype=owners.dtype))  # exactly one owner per row
    if 6 % tp == 0:  # TINY has 6 columns: whole columns per rank
        assert all(s.shard.start in TINY_STARTS for s in shards)

    total = torch.zeros_like(full)
    for s in shards:
        part = s.lookup(ids)
        mine = s.owns(ids)
        assert not part[~mine].any()  # unowned -> zero
        assert torch.equal(part[mine], full[mine])
        assert s.values.shape[0] == s.scales.shape[0] == s.shard.num_rows  # holds only its own rows
        total += part
    assert torch.equal(total, full)


# ---- memory mapping: only this rank's rows are read -------------------------------------


def test_loader_reads_only_its_row_range(tmp_path, monkeypatch):
    weight, scale = random_table(MXFP4, 434)
    path = write(tmp_path / "t.safetensors", {W: weight, S: scale})
    import safetensors

    requested: list[tuple[str, int, int]] = []
    real_open = safetensors.safe_open

    class SpySlice:
        def __init__(self, name, inner):
            self.name, self.inner = name, inner

        def __getattr__(self, attr):
            return getattr(self.inner, attr)

        def __getitem__(self, key):
            requested.append((self.name, key.start, key.stop))
            return self.inner[key]

    class SpyFile:
        def __init__(self, *args, **kwargs):
            self.inner = real_open(*args, **kwargs)

        def __enter__(self):
            self.f = self.inner.__enter__()
            return self

        def __exit__(self, *exc):
            return self.inner.__exit__(*exc)

        def keys(self):
            return self.f.keys()

        def get_slice(self, name):
            return SpySlice(name, self.f.get_slice(name))

        def get_tensor(self, name):
            raise AssertionError(f"whole tensor {name} materialised")

    monkeypatch.setattr(safetensors, "safe_open", SpyFile)
    table = EngramTable.from_safetensors(path, PREFIX, TINY_STARTS, tp_rank=2, tp_size=3, chunk_rows=50)
    assert (table.shard.start, table.shard.stop) == (272, 434)
    assert requested and all(272 <= a < b <= 434 for _, a, b in requested)
    assert {n for n, _, _ in requested} == {W, S}
    assert table.nbytes == 162 * 136


def test_loading_a_shard_of_a_large_file_does_not_touch_the_rest(tmp_path):
    # 1.5 M MXFP4 rows = 204 MB on disk; rank 7 of 8 owns 25.5 MB. Peak resident memory of a
    # fresh process must grow by far less than the file (mapped pages it touched count too).
    rows = 1_500_000
    codes = torch.randint(0, 256, (rows, 128), dtype=torch.uint8)
    scale = torch.full((rows, 8), 127, dtype=torch.uint8).view(torch.float8_e8m0fnu)
    path = write(tmp_path / "big.safetensors", {W: codes, S: scale})
    del codes, scale
    script = textwrap.dedent(
        f"""
        import torch
        from sglang_ds41.engram.table import EngramTable

        def status(key):
            for line in open("/proc/self/status"):
                if line.startswith(key):
                    return int(line.split()[1]) * 1024
        EngramTable.from_tensors(torch.zeros(64, 128, dtype=torch.uint8),
                                 torch.zeros(64, 8, dtype=torch.uint8), tp_rank=1, tp_size=2)
        before = status("VmHWM:")
        table = EngramTable.from_safetensors({str(path)!r}, {PREFIX!r}, tp_rank=7, tp_size=8)
        print(status("VmHWM:") - before, table.nbytes)
        """
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True)
    grown, held = map(int, out.stdout.split())
    assert held == 187_500 * 136
    file_bytes = rows * 136
    assert grown < file_bytes / 2, (grown, file_bytes)  # whole-file reads measure >= 2x this


def test_pinning_follows_cuda_availability(monkeypatch):
    calls = []
    real_empty = torch.empty

    def spy_empty(*args, **kwargs):
        calls.append(kwargs.get("pin_memory", False))
        return real_empty(*args, **{k: v for k, v in kwargs.items() if k != "pin_memory"})

    monkeypatch.setattr(table_mod.torch, "empty", spy_empty)
    monkeypatch.setattr(table_mod.torch.cuda, "is_available", lambda: True)
    EngramTable.from_tensors(*random_table(FP8, 4))
    monkeypatch.setattr(table_mod.torch.cuda, "is_available", lambda: False)
    EngramTable.from_tensors(*random_table(FP8, 4))
    assert calls == [True, True, False, False]  # each table's values and scales arrays


@pytest.mark.parametrize("quant", list(ENGRAM_FORMATS.values()), ids=list(ENGRAM_FORMATS))
def test_lookup_across_gather_chunks(monkeypatch, quant):
    from sglang_ds41.engram import gather

    monkeypatch.setattr(gather, "GATHER_CHUNK_ROWS", 7)
    tensors = table_tensors(quant, 434, seed=9)
    weight, scale, *ws2 = tensors.values()
    ids = torch.randint(0, 434, (5, 24))  # 120 rows = 17 full chunks + 1 partial
    for tp_rank in range(2):
        global_scale = ws2[0] if ws2 else None
        table = EngramTable.from_tensors(weight, scale, TINY_STARTS, tp_rank, 2, global_scale=global_scale)
        want = torch.where(table.owns(ids)[..., None], tensors_oracle(tensors)[ids], 0)
        assert torch.equal(table.lookup(ids), want.to(torch.bfloat16))
