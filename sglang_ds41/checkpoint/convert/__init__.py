"""`convert-engram`: re-encode a checkpoint's Engram tables FP8 -> MXFP4 / NVFP4 (or MXFP4 -> FP8).

The official tables are 202 GB of FP8 (264 B/row); as MXFP4 (136 B/row) a TP=4 rank holds an
Engram table in 12.2 GiB instead of 23.6 GiB (MODEL.md §8.4, §9.2), as NVFP4 (144 B/row, the
format of `formats/nvfp4.py`'s docstring) in 12.9 GiB. Both 4-bit targets choose each block's
scale for the least squared error by default (``--scale-rule mse``; ``ocp`` / ``modelopt`` give
the standard amax rules), and every conversion measures what it lost (`quality`). Users
convert the files they downloaded, so the conversion must survive what a 500 GB job meets:

* bounded memory: source rows are read with ``pread`` (a memory map would keep every touched
  page resident, i.e. RSS = table size) in row chunks, at most three alive at a time; every
  other tensor is copied byte for byte by the kernel (``copy_file_range``), never through a
  float or through this process;
* near disk speed: the table rows are re-encoded by a compiled loop on all cores while the next
  chunk is read and the previous one written (`overlapped`);
* atomic + resumable: each output file is written as ``*.partial``, fsync'd and renamed; the
  journal ``.convert-engram.json`` in DST records finished shards (their sizes and the quality
  statistics of the rows they hold), so a rerun after a kill skips them and redoes the rest;
  the quality report ``engram_quality.json`` and then config.json are written last;
* verified: the result is opened through the validating reader (tensor names, shapes, dtypes,
  sizes), compared with the source tensor by tensor, and sampled rows are checked against the
  definition (`formats`, not the fast path that wrote them).

Modules, by job: `plan` (what is converted into what; the output laid out), `source` (reading
the source), `recode` (the compiled re-encoder), `rows` (a chunk re-encoded and measured as the
plan says), `quality` (what a conversion lost, per row), `write` (the output shards),
`journal` (resuming after a kill), `report` (the dry run and the quality report), `verify`
(the result against its source), `run` (`convert`, all of it in order).
"""

from __future__ import annotations

from sglang_ds41.checkpoint.convert.errors import ConvertError
from sglang_ds41.checkpoint.convert.journal import JOURNAL, KILL_ENV
from sglang_ds41.checkpoint.convert.plan import FORMATS, SOURCE_OF, Plan, make_plan, resolve_scale_rule
from sglang_ds41.checkpoint.convert.report import (
    DEFAULT_REPORT_ROWS,
    describe_plan,
    measure_rows_per_second,
    sample_report,
)
from sglang_ds41.checkpoint.convert.run import DEFAULT_CHUNK_ROWS, Result, convert

__all__ = [
    "DEFAULT_CHUNK_ROWS",
    "DEFAULT_REPORT_ROWS",
    "FORMATS",
    "JOURNAL",
    "KILL_ENV",
    "SOURCE_OF",
    "ConvertError",
    "Plan",
    "Result",
    "convert",
    "describe_plan",
    "make_plan",
    "measure_rows_per_second",
    "resolve_scale_rule",
    "sample_report",
]
