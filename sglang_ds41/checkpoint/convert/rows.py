"""A chunk of a table's rows re-encoded and measured as the plan says: what a conversion writes
and reports, what the dry run times and samples."""

from __future__ import annotations

import numpy as np

from sglang_ds41.checkpoint.convert import quality
from sglang_ds41.checkpoint.convert.plan import Plan, Table
from sglang_ds41.checkpoint.convert.quality import Quality
from sglang_ds41.checkpoint.convert.recode import recode
from sglang_ds41.checkpoint.convert.source import Sources


def encode(plan: Plan, table: Table, rows: tuple[np.ndarray, np.ndarray], workers: int):
    """Source rows -> the output's (values, scales) bytes, as the conversion writes them."""
    rule, ws2 = plan.scale_rule, table.global_scale
    return recode(plan.to, *rows, workers=workers, scale_rule=rule, global_scale=ws2)


def measure(plan: Plan, table: Table, rows, encoded, workers: int) -> Quality:
    return quality.measure(plan.source_format, *rows, plan.to, *encoded, table.global_scale, workers)




def warm_up(plan: Plan, sources: Sources) -> None:
    """Compile (or load) the re-encoder and the measurement on one row, so the rows/s a run
    reports is the steady rate and not numba's start-up."""
    t = plan.tables[0]
    first = sources.rows(t, 0, 1)
    measure(plan, t, first, encode(plan, t, first, 1), 1)
