"""`sglang-ds41 convert-engram`: re-encode a checkpoint's Engram tables (FP8 <-> MXFP4)."""

from __future__ import annotations

import argparse

NAME = "convert-engram"
HELP = (
    "Write a copy of a checkpoint whose Engram tables are re-encoded (FP8 -> MXFP4, or back for "
    "testing): streaming, bounded memory, resumable after a kill, verified at the end."
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("src_dir", metavar="SRC_DIR", help="source checkpoint directory")
    parser.add_argument(
        "dst_dir", metavar="DST_DIR", help="output directory: new/empty, or a previous run's to resume"
    )
    parser.add_argument("--to", default="mxfp4", help="target Engram format: mxfp4 (default) or fp8")
    parser.add_argument(
        "--layers", default=None, help="comma-separated Engram layer ids to convert (default: all)"
    )
    parser.add_argument(
        "--dry-run", action="store_true", help="print the plan and a time estimate, write nothing"
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
    from sglang_ds41.checkpoint.convert_engram import ConvertError

    if text is None:
        return None
    try:
        return [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise ConvertError(f"--layers {text!r}: expected comma-separated integers, e.g. 1,14") from None


def run(args: argparse.Namespace) -> int:
    from sglang_ds41.checkpoint import convert_engram as ce

    layers = _layers(args.layers)
    if args.dry_run:
        plan = ce.make_plan(args.src_dir, args.dst_dir, args.to, layers)
        rows_per_s = ce.measure_rows_per_second(plan, workers=args.workers)
        print(ce.describe_plan(plan, rows_per_s, args.disk_mbps * 1e6))
        return 0
    result = ce.convert(
        args.src_dir,
        args.dst_dir,
        args.to,
        layers=layers,
        chunk_rows=args.chunk_rows or ce.DEFAULT_CHUNK_ROWS,
        workers=args.workers,
        progress=not args.no_progress,
        verify_rows=args.verify_rows,
    )
    plan = result.plan
    print(
        f"converted {plan.src} -> {plan.dst}: Engram layers {[t.layer for t in plan.tables]} "
        f"{plan.source_format.upper()} -> {plan.to.upper()}, {len(result.written)} shard(s) written, "
        f"{len(result.skipped)} resumed, {plan.output_bytes:,} bytes in {result.seconds:.1f} s"
    )
    print(result.verification.describe())
    return 0
