"""`sglang-ds41 convert-engram`: re-encode a checkpoint's Engram tables (FP8 -> MXFP4 / NVFP4, or back)."""

from __future__ import annotations

import argparse

NAME = "convert-engram"
HELP = (
    "Write a copy of a checkpoint whose Engram tables are re-encoded (FP8 -> MXFP4 or NVFP4, or "
    "MXFP4 back to FP8): streaming, bounded memory, resumable after a kill, verified at the end, "
    "with a quality report of every converted row."
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from sglang_ds41.engram.layout import HEAD_DIM
    from sglang_ds41.formats.engram import FP8, MXFP4, NVFP4  # torch-free, as `--help` should be

    mx, nv = MXFP4.bytes_per_row(HEAD_DIM), NVFP4.bytes_per_row(HEAD_DIM)
    parser.add_argument("src_dir", metavar="SRC_DIR", help="source checkpoint directory")
    parser.add_argument(
        "dst_dir", metavar="DST_DIR", help="output directory: new/empty, or a previous run's to resume"
    )
    parser.add_argument(
        "--to",
        default=MXFP4.name,
        help=f"target Engram format: {MXFP4.name} (default, {mx} B/row), {NVFP4.name} ({nv} B/row) or "
        f"{FP8.name} (from MXFP4)",
    )
    parser.add_argument(
        "--scale-rule",
        default=None,
        help="block scales of a 4-bit target: mse (default: of the standard scale and its neighbours, "
        "the one with the least squared error; read by any decoder, never worse per block), or the "
        "standard amax rule: ocp (MXFP4) / modelopt (NVFP4)",
    )
    parser.add_argument(
        "--layers", default=None, help="comma-separated Engram layer ids to convert (default: all)"
    )
    parser.add_argument(
        "--dry-run", action="store_true", help="print the plan and a time estimate, write nothing"
    )
    parser.add_argument(
        "--report",
        action="store_true",
        help="with --dry-run: also the quality report, on a sample of rows (a conversion always "
        "reports on every row it writes, into DST/engram_quality.json)",
    )
    parser.add_argument(
        "--report-rows", type=int, default=None, help="rows per table --report samples (default 65536)"
    )
    parser.add_argument(
        "--disk-mbps", type=float, default=1000.0,
        help="assumed disk bandwidth for --dry-run's estimate of the copied bytes (default 1000 MB/s)",
    )  # fmt: skip
    parser.add_argument("--chunk-rows", type=int, default=None, help="table rows per conversion step")
    parser.add_argument("--workers", type=int, default=None, help="recoding threads (default: CPUs, max 8)")
    parser.add_argument("--verify-rows", type=int, default=1024, help="rows per table decoded in the check")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")


def _layers(text: str | None) -> list[int] | None:
    from sglang_ds41.checkpoint.convert import ConvertError

    if text is None:
        return None
    try:
        return [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise ConvertError(f"--layers {text!r}: expected comma-separated integers, e.g. 1,14") from None


def run(args: argparse.Namespace) -> int:
    from sglang_ds41.checkpoint import convert as ce
    from sglang_ds41.checkpoint.convert import quality

    layers = _layers(args.layers)
    if args.report_rows is not None and args.report_rows <= 0:
        raise ce.ConvertError(f"--report-rows must be positive, got {args.report_rows}")
    if args.dry_run:
        plan = ce.make_plan(args.src_dir, args.dst_dir, args.to, layers, args.scale_rule)
        rows_per_s = ce.measure_rows_per_second(plan, workers=args.workers)
        print(ce.describe_plan(plan, rows_per_s, args.disk_mbps * 1e6))
        if args.report:
            rows = args.report_rows or ce.DEFAULT_REPORT_ROWS
            print(quality.render(ce.sample_report(plan, rows, args.workers), rows))
        return 0
    result = ce.convert(
        args.src_dir,
        args.dst_dir,
        args.to,
        layers=layers,
        scale_rule=args.scale_rule,
        chunk_rows=args.chunk_rows or ce.DEFAULT_CHUNK_ROWS,
        workers=args.workers,
        progress=not args.no_progress,
        verify_rows=args.verify_rows,
    )
    plan = result.plan
    rule = f" ({plan.scale_rule} scales)" if plan.target.four_bit else ""
    print(
        f"converted {plan.src} -> {plan.dst}: Engram layers {[t.layer for t in plan.tables]} "
        f"{plan.source_format.upper()} -> {plan.to.upper()}{rule}, {len(result.written)} shard(s) written, "
        f"{len(result.skipped)} resumed, {plan.output_bytes:,} bytes in {result.seconds:.1f} s "
        f"({result.rows_per_s:,.0f} rows/s re-encoded and measured)"
    )
    print(result.verification.describe())
    print(quality.render(result.report, None))
    print(f"quality report: {plan.dst / quality.REPORT_FILE}")
    return 0
