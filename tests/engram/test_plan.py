"""Engram memory per TP rank against MODEL.md §9.2, through the `engram-plan` CLI."""

from __future__ import annotations

import itertools
import json
import subprocess
import sys

import pytest

from sglang_ds41.config import V41Config
from sglang_ds41.engram.layout import EngramLayout
from sglang_ds41.engram.plan import FORMATS, plan, shard_ranges

from .conftest import OFFICIAL_CONFIG


def engram_plan(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "sglang_ds41", "engram-plan", *args],
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.fixture(scope="module")
def tp4_json() -> dict:
    result = engram_plan(str(OFFICIAL_CONFIG), "--tp", "4", "--json")
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def test_tp4_per_table_per_rank_matches_spec(tp4_json: dict) -> None:
    formats = tp4_json["formats"]
    assert formats["mxfp4"]["per_table_per_rank_max_gib"] == [12.16, 12.16]
    assert formats["fp8"]["per_table_per_rank_max_gib"] == [23.60, 23.60]
    # Both tables: MODEL.md §9.2 "24.3 GiB vs 47.2 GiB per rank" (table: 24.32 / 47.21).
    assert formats["mxfp4"]["both_tables_per_rank_max_gib"] == 24.32
    assert formats["fp8"]["both_tables_per_rank_max_gib"] == 47.21


def test_tp4_rows_split_on_column_boundaries(tp4_json: dict) -> None:
    layer1, layer14 = tp4_json["tables"]
    assert (layer1["rows"], layer14["rows"]) == (384_006_168, 384_016_682)
    assert layer1["split"] == "columns"
    assert layer1["rows_per_rank"][0] == 96_000_564  # = offset of column 6 (Appendix A)
    assert layer1["rows_per_rank"][-1] == 96_002_514
    assert sum(layer14["rows_per_rank"]) == 384_016_682


def test_table_output_shows_the_spec_numbers() -> None:
    result = engram_plan(str(OFFICIAL_CONFIG), "--tp", "4", "--format", "mxfp4", "--format", "fp8")
    assert result.returncode == 0, result.stderr
    assert "12.16 GiB" in result.stdout
    assert "23.60 GiB" in result.stdout
    assert "nvfp4" not in result.stdout


@pytest.mark.parametrize(
    ("tp", "fp8_table", "mxfp4_table", "fp8_both", "mxfp4_both"),
    [(2, 47.21, 24.32, 94.42, 48.64), (8, 11.80, 6.08, 23.60, 12.16)],
)
def test_tp2_and_tp8_match_spec(
    official_config: V41Config,
    tp: int,
    fp8_table: float,
    mxfp4_table: float,
    fp8_both: float,
    mxfp4_both: float,
) -> None:
    the_plan = plan(EngramLayout.from_config(official_config.text), tp)
    gib = 1 << 30
    for fmt, per_table, both in (("fp8", fp8_table, fp8_both), ("mxfp4", mxfp4_table, mxfp4_both)):
        for table in the_plan.tables:
            assert round(the_plan.max_table_bytes_per_rank(table, FORMATS[fmt]) / gib, 2) == per_table
        assert round(the_plan.max_bytes_per_rank(FORMATS[fmt]) / gib, 2) == both


def test_tp2_and_tp8_rows_match_spec(official_config: V41Config) -> None:
    layout = EngramLayout.from_config(official_config.text)
    assert plan(layout, 2).tables[0].rows_per_rank == (192_001_740, 192_004_428)
    for rows in plan(layout, 8).tables[0].rows_per_rank:
        assert 48_000_200 <= rows < 48_001_400  # "≈ 48,000,2xx–48,001,3xx"


def test_whole_tables_match_spec_totals(official_config: V41Config) -> None:
    the_plan = plan(EngramLayout.from_config(official_config.text), 4)
    assert the_plan.rows_total == 768_022_850
    assert the_plan.total_bytes(FORMATS["fp8"]) == 202_758_032_400
    assert the_plan.total_bytes(FORMATS["mxfp4"]) == 104_451_107_600
    assert the_plan.total_bytes(FORMATS["nvfp4"]) == 110_595_290_400 + 2 * 4  # + F32 global scales
    assert the_plan.host_bytes_per_node(FORMATS["mxfp4"]) == 104_451_107_600
    assert (
        plan(EngramLayout.from_config(official_config.text), 4, nnodes=2).host_bytes_per_node(
            FORMATS["mxfp4"]
        )
        < 104_451_107_600 // 2 + 10**6
    )


@pytest.mark.parametrize("tp", [1, 2, 3, 4, 5, 7, 8, 16, 24, 32])
def test_every_row_has_exactly_one_owner(official_config: V41Config, tp: int) -> None:
    for layer in EngramLayout.from_config(official_config.text).layers:
        ranges = shard_ranges(layer, tp)
        assert len(ranges) == tp
        assert ranges[0][0] == 0 and ranges[-1][1] == layer.num_rows
        assert all(a[1] == b[0] for a, b in itertools.pairwise(ranges))


def test_row_shards_are_sglangs_for_every_tp(official_config: V41Config) -> None:
    """SGLang 0.5.23's own split (`layers/engram.py::shard_range`, which its FP8 Engram path
    uses): whole hash columns when they divide over the ranks, else equal rows. A TP rank of
    ours must own the rows SGLang's would, or a mixed deployment / its loader disagrees."""
    sglang_engram = pytest.importorskip("sglang.srt.layers.engram")
    for layer in EngramLayout.from_config(official_config.text).layers:
        bounds = tuple(layer.column_starts())
        for tp in (1, 2, 3, 4, 5, 6, 7, 8, 16, 24, 32):
            theirs = [sglang_engram.shard_range(layer.num_rows, bounds, r, tp) for r in range(tp)]
            assert shard_ranges(layer, tp) == theirs, (layer.layer_id, tp)


def test_bad_tp_is_a_clear_error() -> None:
    result = engram_plan(str(OFFICIAL_CONFIG), "--tp", "0")
    assert result.returncode == 2
    assert "tensor-parallel size must be >= 1" in result.stderr
    assert "Traceback" not in result.stderr


def test_missing_config_is_a_clear_error(tmp_path) -> None:
    result = engram_plan(str(tmp_path), "--tp", "4")
    assert result.returncode == 2
    assert "no config file" in result.stderr


def test_default_output_prints_all_three_formats(tp4_json: dict) -> None:
    result = engram_plan(str(OFFICIAL_CONFIG), "--tp", "4")
    assert result.returncode == 0, result.stderr
    rows = {cells[0]: cells for line in result.stdout.splitlines() if (cells := line.split())}
    assert (rows["fp8"][1], rows["mxfp4"][1], rows["nvfp4"][1]) == ("264", "136", "144")
    nv = tp4_json["formats"]["nvfp4"]
    for table, max_bytes in zip(tp4_json["tables"], nv["per_table_per_rank_max_bytes"], strict=True):
        assert max_bytes == max(table["rows_per_rank"]) * 144 + 4  # + the replicated F32 global scale
    assert nv["total_bytes"] == 110_595_290_400 + 2 * 4  # MODEL.md §9.2


# MODEL.md §9.1: the base release's bytes; §9.2: the two FP8 tables' rows (264 B each)
OFFICIAL_BYTES = 510_286_023_000
OFFICIAL_FP8_TABLE_BYTES = (384_006_168 + 384_016_682) * 264


@pytest.mark.parametrize(
    ("hbm_gib", "expected"),
    [
        (140, {"fp8": "hbm", "mxfp4": "hbm", "nvfp4": "hbm"}),  # an H200: both fit, MXFP4 leaves more KV
        (120, {"fp8": "host", "mxfp4": "hbm", "nvfp4": "hbm"}),  # FP8 tables must leave HBM, MXFP4 stay
        (80, {"fp8": "does not fit", "mxfp4": "does not fit", "nvfp4": "does not fit"}),
    ],
)
def test_placement_per_rank_puts_tables_where_they_fit(hbm_gib, expected) -> None:
    result = engram_plan(str(OFFICIAL_CONFIG), "--tp", "4", "--hbm-gib", str(hbm_gib), "--json")
    assert result.returncode == 0, result.stderr
    placement = json.loads(result.stdout)["placement"]
    other_gib = (OFFICIAL_BYTES - OFFICIAL_FP8_TABLE_BYTES) / 4 / 2**30
    assert placement["other_weights_per_rank_gib"] == pytest.approx(other_gib, abs=0.01)
    engram_gib = {"fp8": 47.21, "mxfp4": 24.32, "nvfp4": 25.75}
    for name, where in expected.items():
        f = placement["formats"][name]
        assert f["placement"] == where
        kv_gib = hbm_gib - 10 - other_gib - engram_gib[name]  # 10: the default --reserve-gib
        assert f["kv_gib_if_tables_in_hbm"] == pytest.approx(kv_gib, abs=0.02)


def test_placement_is_in_the_table_output() -> None:
    result = engram_plan(str(OFFICIAL_CONFIG), "--tp", "4", "--hbm-gib", "120")
    assert result.returncode == 0, result.stderr
    lines = {cells[0]: line for line in result.stdout.splitlines() if (cells := line.split())}
    assert "host: SGLANG_ENABLE_DSV41_ENGRAM_HOST_TABLE=1" in lines["fp8:"]
    assert "HBM" in lines["mxfp4:"]
