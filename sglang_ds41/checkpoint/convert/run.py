"""One conversion from start to finish: plan, resume from the journal, write, report, verify."""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sglang_ds41.checkpoint.convert.errors import ConvertError
from sglang_ds41.checkpoint.convert.journal import Journal
from sglang_ds41.checkpoint.convert.plan import Plan, make_plan
from sglang_ds41.checkpoint.convert.quality import REPORT_FILE, Quality, TableReport, report_json
from sglang_ds41.checkpoint.convert.recode import default_workers
from sglang_ds41.checkpoint.convert.report import table_report
from sglang_ds41.checkpoint.convert.rows import warm_up
from sglang_ds41.checkpoint.convert.source import Sources
from sglang_ds41.checkpoint.convert.write import (
    Progress,
    copy_other,
    remove_partials,
    require_space,
    write_shard,
)
from sglang_ds41.checkpoint.reader import CONFIG_FILE, INDEX_FILE
from sglang_ds41.checkpoint.st_writer import PWrite, write_bytes_atomic
from sglang_ds41.formats.engram import MXFP4

DEFAULT_CHUNK_ROWS = 1 << 16  # ~17 MB of FP8 rows in, ~100 MB of transient arrays


@dataclass
class Result:
    plan: Plan
    written: list[str]
    skipped: list[str]
    seconds: float
    rows_per_s: float
    report: list[TableReport] = field(default_factory=list)
    verification: Any = None


def _report(plan: Plan, journal: Journal) -> list[TableReport]:
    quality = journal.quality()
    return [table_report(plan, t, quality.get(t.layer, Quality())) for t in plan.tables]


def convert(
    src: str | Path,
    dst: str | Path,
    to: str = MXFP4.name,
    *,
    layers: Iterable[int] | None = None,
    scale_rule: str | None = None,
    chunk_rows: int = DEFAULT_CHUNK_ROWS,
    workers: int | None = None,
    progress: bool = False,
    verify_rows: int = 1024,
    check_space: bool = True,
    pwrite: PWrite = os.pwrite,
    log: Callable[[str], None] = print,
) -> Result:
    """Convert SRC's Engram tables into DST (resuming a previous run there), then verify.

    `scale_rule`: the 4-bit targets' block-scale rule (default ``mse``). The quality report of
    every converted row is `Result.report` (`quality.render` prints it) and is written to
    DST as ``engram_quality.json``."""
    from sglang_ds41.checkpoint.convert.verify import verify

    if chunk_rows <= 0:
        raise ConvertError(f"chunk_rows must be positive, got {chunk_rows}")
    workers = workers or default_workers()
    start = time.perf_counter()
    plan = make_plan(src, dst, to, layers, scale_rule)
    journal = Journal(plan, pwrite)
    journal.load_or_start()
    written, skipped = [], []
    prog = Progress(None)
    if not journal.complete:
        remove_partials(plan.dst)
        todo = [s for s in plan.shards if not journal.finished(s)]
        skipped = [s.file for s in plan.shards if s not in todo]
        if skipped:
            log(f"resuming: {len(skipped)} of {len(plan.shards)} shard(s) already done")
        if check_space:
            require_space(plan, todo)
        bar = None
        if progress:
            from tqdm import tqdm

            bar = tqdm(total=sum(s.size for s in todo), unit="B", unit_scale=True, desc="convert-engram")
        prog.bar = bar
        remaining = sum(s.size for s in todo)
        with Sources(plan.src) as sources:
            warm_up(plan, sources)
            for shard in todo:
                remaining -= shard.size
                quality = write_shard(plan, shard, sources, chunk_rows, pwrite, prog, remaining, workers)
                journal.record(shard, quality)
                written.append(shard.file)
        if bar is not None:
            bar.close()
        for name in plan.other_files:
            copy_other(plan, name, pwrite)
        if plan.index_json is not None:
            write_bytes_atomic(plan.dst / INDEX_FILE, plan.index_json, pwrite)
        report = _report(plan, journal)
        write_bytes_atomic(
            plan.dst / REPORT_FILE,
            report_json(str(plan.src), report, None),
            pwrite,
        )
        write_bytes_atomic(plan.dst / CONFIG_FILE, plan.config_json, pwrite)  # last: marks a checkpoint
        journal.data["complete"] = True
        journal.save()
    else:
        log(f"{plan.dst}: conversion already complete; verifying")
        report = _report(plan, journal)
    rows_per_s = prog.rows / max(prog.convert_seconds, 1e-9)
    result = Result(plan, written, skipped, time.perf_counter() - start, rows_per_s, report)
    result.verification = verify(plan, rows=verify_rows)
    return result
