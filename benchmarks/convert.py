"""`convert-engram` throughput and memory next to a plain file copy of the same bytes.

    .venv/bin/python benchmarks/convert.py [--table-gb 0.25,2,4] [--mix-gb 1.5] [--repeat 2]
                                           [--workdir DIR] [--chunk-rows N]

For each size: writes a synthetic checkpoint (the tiny config with 256-wide FP8 Engram tables
whose row counts give `--table-gb` GB of table bytes; random non-NaN FP8 rows; for `--mix-gb`
also a vocabulary grown until the other tensors hold the official checkpoint's share, 1.6 bytes
per table byte), then, alternating, `--repeat` times each:

* copy: `shutil.copyfile` of every source shard + fsync (the disk/page-cache bound), MB/s;
* convert: `convert-engram --to mxfp4` in a child process (plan + write + fsync, then the
  verification, timed separately), MB/s of source bytes, rows/s, and the child's peak RSS
  (VmHWM) next to the RSS of a child that only imports the same modules.

The best run of each counts (this machine's disk is shared; all runs are in the JSON). Peak RSS
should not grow with the table size (rows go through in chunks). The source was just written,
so both read mostly from the page cache and both wait for their writes to reach the disk; the
ratio convert / copy is the figure of merit. Writes `benchmarks/results/convert.json` and prints
a short markdown table.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from sglang_ds41.checkpoint.manifest import build_manifest
from sglang_ds41.checkpoint.reader import CONFIG_FILE, INDEX_FILE
from sglang_ds41.checkpoint.st_writer import HeaderEntry, PartialFile, build_header, canonical_order
from sglang_ds41.checkpoint.tiny import tiny_config
from sglang_ds41.config import V41Config
from sglang_ds41.engram.layout import HEAD_DIM, build_layout
from sglang_ds41.formats import bytes_per_row, scale_bytes

RESULTS = Path(__file__).resolve().parent / "results" / "convert.json"
ROW_BYTES = bytes_per_row("fp8", HEAD_DIM)
SCALE_BYTES = scale_bytes("fp8", HEAD_DIM)
CHUNK = 1 << 16
# The official base checkpoint: 510.29 GB, of which 196.61 GB the Engram tables' FP8 codes (MODEL.md §9.1).
OFFICIAL_OTHER_PER_TABLE_BYTE = (510_286_023_000 - 196_613_849_600) / 196_613_849_600

_CHILD = """
import json, sys, time
def peak_rss_kb():
    # VmHWM, not ru_maxrss: after a vfork+exec ru_maxrss still holds the parent's peak.
    for line in open("/proc/self/status"):
        if line.startswith("VmHWM:"):
            return int(line.split()[1])
from sglang_ds41.checkpoint import convert as ce
if sys.argv[1] == "idle":
    import sglang_ds41.checkpoint.convert.verify, torch, numpy  # noqa
    print(json.dumps({"rss_kb": peak_rss_kb()}))
    sys.exit()
from sglang_ds41.checkpoint.convert import verify as verify_convert
timing = {}
real_verify = verify_convert.verify
def timed_verify(plan, rows):
    timing["write_s"] = time.perf_counter() - t0
    t1 = time.perf_counter()
    out = real_verify(plan, rows=rows)
    timing["verify_s"] = time.perf_counter() - t1
    return out
verify_convert.verify = timed_verify
t0 = time.perf_counter()
r = ce.convert(sys.argv[1], sys.argv[2], "mxfp4", chunk_rows=int(sys.argv[3]), log=lambda _: None)
print(json.dumps({**timing, "rows": r.plan.rows, "rows_per_s_convert_only": r.rows_per_s,
                  "rss_kb": peak_rss_kb(),
                  "stats": [t.describe() for t in r.verification.tables]}))
"""


def synthetic_config(table_gb: float, other_gb: float = 0.0) -> dict:
    """The tiny config with `table_gb` GB of Engram tables and ~`other_gb` GB of other tensors
    (a vocabulary grown until embedding + head hold them)."""
    data = tiny_config()
    t = data["text_config"]
    t["vocab_size"] = max(t["vocab_size"], int(other_gb * 1e9 / (2 * 2 * t["hidden_size"])))
    columns = len(t["engram_layer_ids"]) * (t["engram_max_ngram_size"] - 1) * t["engram_n_heads"]
    vocab = max(61, int(table_gb * 1e9 / ROW_BYTES / columns))
    layout = build_layout(
        t["engram_layer_ids"], vocab, t["engram_max_ngram_size"], t["engram_n_heads"],
        t["engram_compressed_vocab_size"],
    )  # fmt: skip
    t.update(engram_head_dim=HEAD_DIM, engram_vocab_size=vocab)
    t["engram_num_embeddings"] = [layer.num_rows for layer in layout.layers]
    return data


def _fp8_rows(rng: np.random.Generator, rows: int) -> tuple[np.ndarray, np.ndarray]:
    weight = rng.integers(0, 0x7F, (rows, HEAD_DIM), dtype=np.uint8)  # no NaN (0x7F) magnitudes
    weight |= rng.integers(0, 2, (rows, HEAD_DIM), dtype=np.uint8) << 7
    return weight, rng.integers(120, 135, (rows, SCALE_BYTES), dtype=np.uint8)


def write_synthetic(root: Path, table_gb: float, other_gb: float = 0.0) -> int:
    """One shard per Engram table plus one for everything else; returns the bytes written."""
    data = synthetic_config(table_gb, other_gb)
    manifest = build_manifest(V41Config.from_dict(data, source="benchmark"))
    root.mkdir(parents=True)
    rng = np.random.default_rng(0)
    groups: dict[str, list] = {}
    for spec in manifest:
        table = ".engram.embed." in spec.name
        file = f"model-table-{spec.name.split('.')[1]}.safetensors" if table else "model-rest.safetensors"
        groups.setdefault(file, []).append(spec)
    weight_map, total = {}, 0
    for file, specs in groups.items():
        entries = canonical_order([HeaderEntry(s.name, s.dtype, s.shape, s.nbytes) for s in specs])
        header, offsets = build_header(entries, {"format": "pt"})
        size = len(header) + sum(e.nbytes for e in entries)
        with PartialFile(root / file, size) as out:
            out.write_at(0, header)
            tables = {
                e.name: off for e, off in zip(entries, offsets, strict=True) if ".engram.embed." in e.name
            }
            for e, off in zip(entries, offsets, strict=True):
                if ".engram.embed." not in e.name:
                    for pos in range(0, e.nbytes, 64 << 20):  # in pieces: a big vocabulary is GBs
                        piece = rng.integers(0, 0x7F, min(64 << 20, e.nbytes - pos), dtype=np.uint8)
                        out.write_at(len(header) + off + pos, piece.data)
            if tables:
                w_name = next(n for n in tables if n.endswith(".weight"))
                s_name = w_name.replace(".weight", ".scale")
                rows = manifest[w_name].shape[0]
                for start in range(0, rows, CHUNK):
                    w, s = _fp8_rows(rng, min(CHUNK, rows - start))
                    out.write_at(len(header) + tables[w_name] + start * HEAD_DIM, w.data)
                    out.write_at(len(header) + tables[s_name] + start * SCALE_BYTES, s.data)
            out.commit()
        weight_map.update({s.name: file for s in specs})
        total += size
    index = {"metadata": {"total_size": manifest.total_bytes}, "weight_map": dict(sorted(weight_map.items()))}
    (root / INDEX_FILE).write_text(json.dumps(index, indent=2) + "\n")
    (root / CONFIG_FILE).write_text(json.dumps(data, indent=2) + "\n")
    return total


def plain_copy(src: Path, dst: Path) -> float:
    dst.mkdir()
    start = time.perf_counter()
    for p in sorted(src.glob("*.safetensors")):
        shutil.copyfile(p, dst / p.name)
        fd = os.open(dst / p.name, os.O_RDONLY)
        os.fsync(fd)
        os.close(fd)
    return time.perf_counter() - start


def child(*args: str) -> dict:
    done = subprocess.run([sys.executable, "-c", _CHILD, *args], capture_output=True, text=True, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def run_size(work: Path, table_gb: float, other_gb: float, chunk_rows: int, repeat: int) -> dict:
    """Copy and convert the same source `repeat` times, alternating; the best of each counts."""
    name = f"{table_gb}+{other_gb}"
    src = work / f"src-{name}"
    nbytes = write_synthetic(src, table_gb, other_gb)
    table_bytes = sum(p.stat().st_size for p in src.glob("model-table-*.safetensors"))
    copies, convs = [], []
    for _ in range(repeat):
        copies.append(plain_copy(src, work / f"copy-{name}"))
        shutil.rmtree(work / f"copy-{name}")
        convs.append(child(str(src), str(work / f"dst-{name}"), str(chunk_rows)))
        shutil.rmtree(work / f"dst-{name}")
    shutil.rmtree(src)
    copy_s = min(copies)
    conv = min(convs, key=lambda c: c["write_s"])
    return {
        "table_gb": table_gb,
        "other_gb": round((nbytes - table_bytes) / 1e9, 3),
        "source_bytes": nbytes,
        "rows": conv["rows"],
        "repeat": repeat,
        "copy_s_all": copies,
        "convert_s_all": [c["write_s"] for c in convs],
        "copy_MBps": nbytes / copy_s / 1e6,
        "convert_MBps": nbytes / conv["write_s"] / 1e6,
        "ratio_convert_over_copy": copy_s / conv["write_s"],
        "rows_per_s": conv["rows"] / conv["write_s"],
        "rows_per_s_recode_only": conv["rows_per_s_convert_only"],
        "verify_s": conv["verify_s"],
        "peak_rss_MB": max(c["rss_kb"] for c in convs) / 1024,
        "peak_rss_MB_all": [c["rss_kb"] / 1024 for c in convs],
        "verification": conv["stats"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--table-gb", default="0.25,2,4", help="Engram table sizes (GB), tables only")
    parser.add_argument(
        "--mix-gb", default="1.5", help="Engram table sizes (GB) plus other tensors in the official ratio"
    )
    parser.add_argument("--repeat", type=int, default=2, help="copy/convert runs per size (best counts)")
    parser.add_argument("--workdir", default=None, help="scratch directory on the disk to measure")
    parser.add_argument("--chunk-rows", type=int, default=1 << 16)
    args = parser.parse_args()
    sizes = [(float(x), 0.0) for x in args.table_gb.split(",") if x]
    sizes += [(float(x), float(x) * OFFICIAL_OTHER_PER_TABLE_BYTE) for x in args.mix_gb.split(",") if x]
    with tempfile.TemporaryDirectory(dir=args.workdir, prefix="convert-bench-") as tmp:
        runs = [run_size(Path(tmp), gb, other, args.chunk_rows, args.repeat) for gb, other in sizes]
    idle_rss = child("idle")["rss_kb"] / 1024
    result = {
        "machine": {"platform": platform.platform(), "cpus": os.cpu_count()},
        "chunk_rows": args.chunk_rows,
        "idle_rss_MB": idle_rss,
        "runs": runs,
    }
    RESULTS.parent.mkdir(exist_ok=True)
    RESULTS.write_text(json.dumps(result, indent=2) + "\n")
    print(f"idle process RSS (imports only): {idle_rss:.0f} MB; chunk {args.chunk_rows} rows")
    print("| table GB | other GB | source bytes | copy MB/s | convert MB/s | ratio | rows/s | peak RSS MB |")
    print("|---|---|---|---|---|---|---|---|")
    for r in runs:
        print(
            f"| {r['table_gb']} | {r['other_gb']} | {r['source_bytes']:,} | {r['copy_MBps']:.0f} "
            f"| {r['convert_MBps']:.0f} "
            f"| {r['ratio_convert_over_copy']:.2f} | {r['rows_per_s']:,.0f} | {r['peak_rss_MB']:.0f} |"
        )


if __name__ == "__main__":
    main()
