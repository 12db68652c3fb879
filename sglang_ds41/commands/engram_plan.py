"""`sglang-ds41 engram-plan`: Engram table rows and memory per TP rank for a config."""

from __future__ import annotations

import argparse

from sglang_ds41.formats.engram import NAMES as ENGRAM_FORMATS

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
        choices=ENGRAM_FORMATS,
        action="append",
        help="table storage format (repeatable; default: all three)",
    )
    parser.add_argument(
        "--hbm-gib",
        type=float,
        default=140.0,
        help="GPU memory per rank, GiB, for the HBM vs host placement (default 140: an H200)",
    )
    parser.add_argument(
        "--reserve-gib",
        type=float,
        default=10.0,
        help="HBM kept for activations, CUDA graphs and the runtime (default 10)",
    )
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")


def run(args: argparse.Namespace) -> int:
    import json

    from sglang_ds41.checkpoint.manifest import ENGRAM_PREFIX, build_manifest
    from sglang_ds41.config import V41Config
    from sglang_ds41.engram.layout import EngramLayout
    from sglang_ds41.engram.plan import format_named, plan
    from sglang_ds41.errors import Ds41Error

    config = V41Config.from_file(args.model)
    the_plan = plan(EngramLayout.from_config(config.text), args.tp, args.nnodes)
    formats = [format_named(name) for name in (args.format or ENGRAM_FORMATS)]
    if args.hbm_gib <= 0 or args.reserve_gib < 0:
        raise Ds41Error(
            f"--hbm-gib must be > 0 and --reserve-gib >= 0, got {args.hbm_gib} / {args.reserve_gib}"
        )
    by_format = build_manifest(config).bytes_by_format()
    other = sum(n for f, n in by_format.items() if not f.startswith(ENGRAM_PREFIX))
    report = _report(config.source, the_plan, formats)
    report["placement"] = _placement(the_plan, formats, other, args.hbm_gib, args.reserve_gib)
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


def _placement(the_plan, formats, other_total: int, hbm_gib: float, reserve_gib: float) -> dict:
    from sglang_ds41.engram.plan import placements, shared_host_bytes_per_node

    other = -(-other_total // the_plan.tp)  # most weights are split over TP; norms etc. are tiny
    chosen = placements(the_plan, formats, other, int(hbm_gib * (1 << 30)), int(reserve_gib * (1 << 30)))
    return {
        "hbm_gib": hbm_gib,
        "reserve_gib": reserve_gib,
        "other_weights_per_rank_gib": _gib(other),
        "other_weights_note": "checkpoint bytes other than the Engram tables (DSpark, vision included) / TP",
        "formats": {
            p.fmt.name: {
                "engram_per_rank_gib": _gib(p.engram_bytes),
                "kv_gib_if_tables_in_hbm": _gib(p.kv_bytes_if_hbm),
                "kv_gib_if_tables_in_host": _gib(p.kv_bytes_if_host),
                "placement": p.where,
                "host_gib_per_node_per_rank_layout": _gib(the_plan.host_bytes_per_node(p.fmt)),
                "host_gib_per_node_shared_layout": _gib(shared_host_bytes_per_node(the_plan, p.fmt)),
            }
            for p in chosen
        },
    }


_WHERE = {
    "hbm": "HBM (device-resident shards, the default)",
    "host": "host: SGLANG_ENABLE_DSV41_ENGRAM_HOST_TABLE=1",
    "does not fit": "does not fit: the other weights alone exceed HBM; more ranks",
}


def _render_placement(placement: dict) -> list[str]:
    lines = [
        "",
        f"Placement per rank on {placement['hbm_gib']:g} GiB of HBM (--hbm-gib), "
        f"{placement['reserve_gib']:g} GiB reserved (--reserve-gib), "
        f"other weights {placement['other_weights_per_rank_gib']:.2f} GiB/rank",
        f"({placement['other_weights_note']}):",
        f"{'format':<6}  {'Engram/rank':>11}  {'KV if in HBM':>12}  {'KV if host':>10}  "
        f"{'host/node per_rank | shared':>27}  placement",
    ]
    for name, f in placement["formats"].items():
        host = (
            f"{f['host_gib_per_node_per_rank_layout']:.2f} | {f['host_gib_per_node_shared_layout']:.2f} GiB"
        )
        lines.append(
            f"{name + ':':<6}  {f['engram_per_rank_gib']:>7.2f} GiB  "
            f"{f['kv_gib_if_tables_in_hbm']:>8.2f} GiB  {f['kv_gib_if_tables_in_host']:>6.2f} GiB  "
            f"{host:>27}  {_WHERE[f['placement']]}"
        )
    return lines


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
    if "placement" in report:
        lines += _render_placement(report["placement"])
    return "\n".join(lines)
