"""`sglang-ds41 engram-plan`: Engram table rows and memory per TP rank for a config."""

from __future__ import annotations

import argparse

NAME = "engram-plan"
HELP = "Show Engram table rows and bytes per tensor-parallel rank (and host memory per node) for a config."


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("model", metavar="MODEL_DIR_OR_CONFIG", help="checkpoint directory or config.json")
    parser.add_argument("--tp", type=int, required=True, help="tensor-parallel size")
    parser.add_argument(
        "--nnodes", type=int, default=1, help="nodes the TP ranks are spread over (default 1)"
    )
    parser.add_argument(
        "--format",
        choices=["fp8", "mxfp4", "nvfp4"],
        action="append",
        help="table storage format (repeatable; default: all three)",
    )
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")


def run(args: argparse.Namespace) -> int:
    import json

    from sglang_ds41.config import V41Config
    from sglang_ds41.engram.layout import EngramLayout
    from sglang_ds41.engram.plan import format_named, plan

    config = V41Config.from_file(args.model)
    the_plan = plan(EngramLayout.from_config(config.text), args.tp, args.nnodes)
    formats = [format_named(name) for name in (args.format or ["fp8", "mxfp4", "nvfp4"])]
    report = _report(config.source, the_plan, formats)
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        print(_render(report))
    return 0


def _gib(n: int) -> float:
    return round(n / (1 << 30), 2)


def _report(source: str, the_plan, formats) -> dict:
    tp = the_plan.tp
    return {
        "config": source,
        "tp": tp,
        "nnodes": the_plan.nnodes,
        "tables": [
            {
                "layer_id": t.layer_id,
                "rows": t.rows,
                "hash_columns": t.n_columns,
                "split": "columns" if t.column_split else "equal_rows",
                "rows_per_rank": list(t.rows_per_rank),
            }
            for t in the_plan.tables
        ],
        "rows_per_rank_both_tables": [the_plan.rows_on_rank(r) for r in range(tp)],
        "formats": {
            fmt.name: {
                "layout": fmt.layout,
                "bytes_per_row": fmt.bytes_per_row,
                "per_table_per_rank_max_bytes": [
                    the_plan.max_table_bytes_per_rank(t, fmt) for t in the_plan.tables
                ],
                "per_table_per_rank_max_gib": [
                    _gib(the_plan.max_table_bytes_per_rank(t, fmt)) for t in the_plan.tables
                ],
                "both_tables_per_rank_bytes": [the_plan.bytes_on_rank(r, fmt) for r in range(tp)],
                "both_tables_per_rank_max_gib": _gib(the_plan.max_bytes_per_rank(fmt)),
                "host_bytes_per_node": the_plan.host_bytes_per_node(fmt),
                "host_gib_per_node": _gib(the_plan.host_bytes_per_node(fmt)),
                "total_bytes": the_plan.total_bytes(fmt),
                "total_gib": _gib(the_plan.total_bytes(fmt)),
            }
            for fmt in formats
        },
    }


def _render(report: dict) -> str:
    tables = report["tables"]
    tp = report["tp"]
    lines = [f"Engram memory plan: {report['config']}", f"TP={tp} over {report['nnodes']} node(s)", ""]
    lines.append(f"{'layer':>5}  {'rows':>13}  split")
    for t in tables:
        split = (
            f"on hash-column boundaries ({t['hash_columns'] // tp} of {t['hash_columns']} columns per rank)"
            if t["split"] == "columns"
            else f"equal row slices ({t['hash_columns']} columns not divisible by TP={tp})"
        )
        lines.append(f"{t['layer_id']:>5}  {t['rows']:>13,}  {split}")
    lines.append("")
    header = "".join(f"  {'layer ' + str(t['layer_id']):>13}" for t in tables)
    lines.append(f"{'rank':>4}{header}  {'both tables':>13}")
    for r in range(tp):
        cells = "".join(f"  {t['rows_per_rank'][r]:>13,}" for t in tables)
        lines.append(f"{r:>4}{cells}  {report['rows_per_rank_both_tables'][r]:>13,}")
    lines.append("")
    per_table = "".join(f"  {'L' + str(t['layer_id']) + '/rank':>10}" for t in tables)
    lines.append(
        f"{'format':<6}  {'B/row':>5}{per_table}  {'both/rank':>10}  {'host/node':>10}  {'all ranks':>10}"
    )
    for name, f in report["formats"].items():
        cells = "".join(f"  {g:>6.2f} GiB" for g in f["per_table_per_rank_max_gib"])
        lines.append(
            f"{name:<6}  {f['bytes_per_row']:>5}{cells}  {f['both_tables_per_rank_max_gib']:>6.2f} GiB"
            f"  {f['host_gib_per_node']:>6.2f} GiB  {f['total_gib']:>6.2f} GiB"
        )
    lines.append("")
    lines.append("GiB per rank = the largest rank. host/node = the shards of one node's ranks")
    lines.append("(host-memory tables, or staging while loading).")
    return "\n".join(lines)
