"""What a conversion tells: the dry run's plan and time estimate, and the quality report
(every converted row, or a sample of rows on a dry run; `quality` measures)."""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np

from sglang_ds41.checkpoint.convert.plan import Plan, Table
from sglang_ds41.checkpoint.convert.quality import Quality, TableReport
from sglang_ds41.checkpoint.convert.recode import default_workers
from sglang_ds41.checkpoint.convert.rows import encode, measure, warm_up
from sglang_ds41.checkpoint.convert.source import Sources
from sglang_ds41.checkpoint.st_writer import free_bytes

DEFAULT_REPORT_ROWS = 1 << 16


def gb(n: float) -> str:
    return f"{n / 1e9:,.2f} GB"




def measure_rows_per_second(plan: Plan, rows: int = 1 << 16, workers: int | None = None) -> float:
    """Re-encode and measure the first `rows` rows of the first table (real data) as the run
    would, timed; nothing is written. The compiled loops are loaded first (steady rate)."""
    t = plan.tables[0]
    n = min(rows, t.rows)
    workers = workers or default_workers()
    with Sources(plan.src) as sources:
        warm_up(plan, sources)
        data = sources.rows(t, 0, n)
        start = time.perf_counter()
        measure(plan, t, data, encode(plan, t, data, workers), workers)
        return n / max(time.perf_counter() - start, 1e-9)




def sample_runs(rows: int, wanted: int, runs: int = 64) -> list[tuple[int, int]]:
    """`runs` evenly spaced runs of consecutive rows, `wanted` rows in all (or every row)."""
    if wanted >= rows:
        return [(0, rows)]
    length = max(1, wanted // runs)
    starts = np.linspace(0, rows - length, min(runs, wanted)).astype(np.int64)
    return [(int(a), int(a) + length) for a in np.unique(starts)]


def sample_report(
    plan: Plan, rows: int = DEFAULT_REPORT_ROWS, workers: int | None = None
) -> list[TableReport]:
    """The quality report on a sample of each table's rows, encoded as the conversion would;
    nothing is written (``--dry-run --report``)."""
    workers = workers or default_workers()
    reports = []
    with Sources(plan.src) as sources:
        for t in plan.tables:
            quality = Quality()
            for start, stop in sample_runs(t.rows, rows):
                data = sources.rows(t, start, stop)
                quality = quality.merge(measure(plan, t, data, encode(plan, t, data, workers), workers))
            reports.append(table_report(plan, t, quality))
    return reports


def table_report(plan: Plan, table: Table, quality: Quality) -> TableReport:
    t, p = table, plan
    return TableReport(t.layer, t.prefix, t.rows, p.source_format, p.to, p.scale_rule, t.width, quality)


def describe_plan(plan: Plan, rows_per_s: float, disk_bytes_per_s: float) -> str:
    copy_bytes = plan.output_bytes - plan.table_bytes_out
    # Table rows are re-encoded while the next ones are read: the slower of the two counts.
    table_seconds = max(plan.rows / rows_per_s, plan.table_bytes_in / disk_bytes_per_s)
    seconds = copy_bytes / disk_bytes_per_s + table_seconds
    with_tables = sum(1 for s in plan.shards if s.tables)
    lines = [
        f"convert-engram plan: {plan.src} -> {plan.dst}",
        f"  Engram tables   {plan.source_format.upper()} -> {plan.to.upper()}: "
        + ", ".join(f"layer {t.layer} ({t.rows:,} rows)" for t in plan.tables),
        f"  scale rule      {plan.scale_rule}"
        + (
            " (least squared error per block among the standard scale and its neighbours; any "
            f"{plan.to.upper()} decoder reads it)"
            if plan.scale_rule == "mse"
            else ""
        ),
        f"  shards          {len(plan.shards)} ({with_tables} with Engram tables)",
        f"  bytes in        {plan.source_bytes:,} ({gb(plan.source_bytes)}); "
        f"Engram {gb(plan.table_bytes_in)}",
        f"  bytes out       {plan.output_bytes:,} ({gb(plan.output_bytes)}); "
        f"Engram {gb(plan.table_bytes_out)}",
        f"  other files     {', '.join(plan.other_files) or '-'} (+ index, config.json)",
        f"  config          engram_embed_quant / engram_embed_layers -> "
        f"{list(plan.quant_layers) or 'removed (all FP8)'}",
        f"  time estimate   {seconds / 60:,.1f} min = {gb(copy_bytes)} copied at "
        f"{disk_bytes_per_s / 1e6:,.0f} MB/s (assumed disk) + {plan.rows:,} rows at the slower of "
        f"{rows_per_s:,.0f} rows/s (re-encoded and measured, here) and the disk",
        f"  free on target  {gb(free_bytes(_existing_parent(plan.dst)))}",
    ]
    return "\n".join(lines)


def _existing_parent(path: Path) -> Path:
    while not path.exists() and path.parent != path:
        path = path.parent
    return path
