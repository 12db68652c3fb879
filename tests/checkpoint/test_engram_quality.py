"""The conversion quality statistics: exact whatever the chunking, and what they count."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from sglang_ds41 import formats
from sglang_ds41.checkpoint.convert.quality import Quality, TableReport, measure, render, report_json
from sglang_ds41.checkpoint.convert.recode import recode


def _fp8_rows(rows: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    g = torch.Generator().manual_seed(seed)
    values, scales = formats.quantize_fp8_rows(torch.randn(rows, 256, generator=g))
    return values.view(torch.uint8).numpy(), scales.view(torch.uint8).numpy()


@pytest.mark.parametrize("to", ["mxfp4", "nvfp4"])
def test_statistics_of_chunks_merge_to_the_whole_exactly(to):
    w, s = _fp8_rows(5000)
    ws2 = float(formats.fp8_rows_global_scale(torch.from_numpy(s)))
    out = recode(to, w, s, global_scale=ws2)
    whole = measure("fp8", w, s, to, *out, ws2, workers=2)
    pieces = Quality()
    for a, b in ((0, 17), (17, 2500), (2500, 5000)):
        pieces = pieces.merge(measure("fp8", w[a:b], s[a:b], to, out[0][a:b], out[1][a:b], ws2))
    assert pieces == whole  # sums in fixed point, histograms, extremes: no rounding drift
    assert Quality.from_json(whole.to_json()) == whole  # as the journal keeps it
    assert whole.rows == whole.measured == 5000


def test_zero_and_non_finite_rows_are_counted_not_measured():
    w, s = _fp8_rows(4)
    w[1] = 0  # an all-zero source row
    w[2, 5] = 0x7F  # a NaN value
    s[3, 0] = 255  # a NaN scale
    out = recode("mxfp4", w, s)
    q = measure("fp8", w, s, "mxfp4", *out)
    assert (q.rows, q.measured, q.zero_rows, q.non_finite_rows) == (4, 1, 1, 2)
    summary = q.summary()
    assert 0.98 < summary["row_cosine"]["min"] == summary["row_cosine"]["mean"] < 1


def test_flushed_blocks_are_blocks_that_decode_to_zero():
    # NVFP4 block scale byte 0 decodes the block to zero: the source row 0's first block is lost
    w, s = _fp8_rows(2, seed=1)
    ws2 = float(formats.fp8_rows_global_scale(torch.from_numpy(s)))
    codes, scales = recode("nvfp4", w, s, global_scale=ws2)
    scales[0, 0] = 0
    q = measure("fp8", w, s, "nvfp4", codes, scales, ws2)
    assert (q.flushed_blocks, q.blocks) == (1, 32)
    assert q.summary()["flushed_blocks"] == round(1 / 32, 7)


def test_lossless_rows_have_cosine_one_and_no_error():
    w, s = _fp8_rows(64, seed=2)
    codes, scales = recode("mxfp4", w, s)
    back = recode("fp8", codes, scales)  # MXFP4 -> FP8 is exact
    summary = measure("mxfp4", codes, scales, "fp8", *back).summary()
    assert summary["row_cosine"] == {"mean": 1.0, "p1": 1.0, "min": 1.0}
    assert summary["relative_error"] == {"mean": 0.0, "p99": 0.0, "max": 0.0}
    assert summary["saturated_blocks"] == 0.0


def test_the_report_names_format_rule_and_bytes_per_row():
    w, s = _fp8_rows(256, seed=3)
    q = measure("fp8", w, s, "mxfp4", *recode("mxfp4", w, s, scale_rule="ocp"))
    report = [TableReport(14, "layers.14.engram.embed", 256, "fp8", "mxfp4", "ocp", 256, q)]
    text = render(report, None)
    assert "mxfp4/ocp" in text and "136 (264)" in text
    data = report_json("/src", report, None)
    assert b'"bytes_per_row": 136' in data and b'"source_bytes_per_row": 264' in data
