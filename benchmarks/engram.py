"""Engram CPU throughput: n-gram hashing and table gather + dequant, next to the memory bound.

    .venv/bin/python benchmarks/engram.py [--table-mb 384] [--tokens 4096] [--repeats 20]

Measures, in one run on this machine:

* hash: batched `EngramHasher.hash_sequence` with the official layout (2 layers x 24
  columns per token), tokens/s;
* gather: `EngramTable.lookup` of uniformly random row ids (what hash ids look like) from
  a synthetic table of `--table-mb` MB, per format: rows/s and GB/s of table bytes read;
* bound: a plain `torch.index_select` of the same rows of the values and scales arrays (the
  same bytes, no decode) — the memory-bandwidth bound of any gather — and the ratio lookup / bound.

Writes `benchmarks/results/engram.json` and prints a short markdown table. Timings are
medians over `--repeats` calls after a warm-up call. On a shared machine, multi-threaded torch
ops stall whenever one of their threads is descheduled; `--threads 1` gives steadier numbers.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import torch

from sglang_ds41.engram.gather import TableFormat
from sglang_ds41.engram.hashing import EngramHasher
from sglang_ds41.engram.layout import build_layout
from sglang_ds41.engram.table import EngramTable, RowShard
from sglang_ds41.formats.engram import engram_format

RESULTS = Path(__file__).resolve().parent / "results" / "engram.json"

# Official V4.1 Engram hash parameters (MODEL.md §1.1)
OFFICIAL = dict(layer_ids=[1, 14], vocab_size=16_000_000, max_ngram_size=4, n_heads=8,
                compressed_vocab_size=99_092)  # fmt: skip
VOCAB = 129_280


def timed(*fns: Callable[[], object], repeats: int) -> list[dict[str, float]]:
    """Wall-clock median / min of each function; calls are interleaved so that every function
    sees the same background load (the CPUs may be shared)."""
    for fn in fns:
        fn()  # warm-up: page faults, decode tables, allocator
    times: list[list[float]] = [[] for _ in fns]
    for _ in range(repeats):
        for fn, ts in zip(fns, times, strict=True):
            t0 = time.perf_counter()
            fn()
            ts.append(time.perf_counter() - t0)
    return [{"median_s": statistics.median(ts), "min_s": min(ts)} for ts in times]


def bench_hash(batch: int, seq_len: int, repeats: int) -> dict:
    layout = build_layout(**OFFICIAL)
    token_map = torch.arange(VOCAB) % OFFICIAL["compressed_vocab_size"]  # content does not affect cost
    hasher = EngramHasher(layout, token_map, pad_token_id=2, image_token_id=None)
    ids = torch.randint(0, VOCAB, (batch, seq_len))
    [t] = timed(lambda: hasher.hash_sequence(ids), repeats=repeats)
    tokens = batch * seq_len
    return {
        "batch": batch, "seq_len": seq_len, "engram_layers": len(OFFICIAL["layer_ids"]),
        "ids_per_token": len(OFFICIAL["layer_ids"]) * layout.n_columns, **t,
        "tokens_per_s": tokens / t["median_s"],
    }  # fmt: skip


def synthetic_table(fmt: TableFormat, table_mb: int) -> EngramTable:
    """Random value bytes with realistic scale bytes."""
    rows = table_mb * 10**6 // fmt.row_bytes
    values = torch.randint(0, 256, (rows, fmt.value_bytes), dtype=torch.uint8)
    scales = torch.randint(115, 135, (rows, fmt.scale_bytes), dtype=torch.uint8)
    return EngramTable(values, scales, fmt, RowShard(0, rows), rows, f"synthetic-{fmt.format.name}")


def bench_gather(fmt: TableFormat, table_mb: int, tokens: int, repeats: int) -> dict:
    table = synthetic_table(fmt, table_mb)
    n_ids = tokens * 24  # one Engram layer: 24 rows per token
    ids = torch.randint(0, table.num_rows, (tokens, 24))
    flat = ids.view(-1)
    def bound_gather() -> None:
        torch.index_select(table.values, 0, flat)
        torch.index_select(table.scales, 0, flat)

    lookup, bound = timed(lambda: table.lookup(ids), bound_gather, repeats=repeats)
    bytes_read = n_ids * fmt.row_bytes
    out = {"format": fmt.format.name, "row_bytes": fmt.row_bytes, "table_rows": table.num_rows,
           "table_bytes": table.nbytes, "tokens": tokens, "rows_per_call": n_ids}  # fmt: skip
    for name, t in (("lookup", lookup), ("index_select", bound)):
        out[name] = {**t, "rows_per_s": n_ids / t["median_s"], "gb_per_s": bytes_read / t["median_s"] / 1e9}
    out["lookup_over_bound"] = bound["median_s"] / lookup["median_s"]
    out["lookup_over_bound_best"] = bound["min_s"] / lookup["min_s"]
    return out


def markdown(result: dict) -> str:
    h = result["hash"]
    lines = [
        f"Engram CPU benchmark — {result['machine']['torch_threads']} torch threads, "
        f"{result['machine']['processor'] or result['machine']['machine']}",
        "",
        "| what | rows/s (median) | GB/s read | vs index_select (median / best) |",
        "|---|---:|---:|---:|",
    ]
    name_bound = "index_select (bound)"
    for g in result["gather"]:
        ratios = f"{g['lookup_over_bound']:.2f} / {g['lookup_over_bound_best']:.2f}"
        for name, label, ratio in (("lookup", "gather+dequant", ratios), ("index_select", name_bound, "1")):
            r = g[name]
            row = f"| {g['format']} {label} | {r['rows_per_s'] / 1e6:.2f} M | {r['gb_per_s']:.2f} | {ratio} |"
            lines.append(row)
    lines += [
        "",
        f"hash: {h['tokens_per_s'] / 1e6:.2f} M tokens/s (batch {h['batch']} x {h['seq_len']}, "
        f"{h['ids_per_token']} ids per token)",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--table-mb", type=int, default=384, help="synthetic table size per format (MB)")
    parser.add_argument("--tokens", type=int, default=4096, help="tokens per lookup call (x24 rows)")
    parser.add_argument("--hash-batch", type=int, default=8)
    parser.add_argument("--hash-seq-len", type=int, default=4096)
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--formats", default="mxfp4,fp8", help="comma-separated: mxfp4, fp8")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's choice)")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)

    formats = {f: TableFormat(engram_format(f)) for f in args.formats.split(",")}
    result = {
        "machine": {"machine": platform.machine(), "processor": platform.processor(),
                    "torch": torch.__version__, "torch_threads": torch.get_num_threads()},
        "hash": bench_hash(args.hash_batch, args.hash_seq_len, args.repeats),
        "gather": [bench_gather(fmt, args.table_mb, args.tokens, args.repeats) for fmt in formats.values()],
    }  # fmt: skip
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(markdown(result))
    print(f"\nwrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
