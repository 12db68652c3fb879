"""Engram gather on a GPU: MXFP4 (ours) vs FP8 (upstream's kernel) from real-size per-rank tables.

    python benchmarks/gpu_engram.py [--out DIR] [--upstream-kernel PATH] [--rows N] [--quick]
    python benchmarks/gpu_engram.py --smoke        # CPU: tiny sizes, Triton interpreter

Needs only torch, triton, numpy and this repository (`PYTHONPATH=.`); no SGLang (the GPU
machines this is run on have none). `scripts/gpu_check.sh` runs it in one go. Parts:

1. **Correctness on the GPU**: the MXFP4 and NVFP4 kernels (`engram.split_gather`, what the
   SGLang plugin uses) against the CPU torch decode, bit for bit, MXFP4 on a table holding every
   (code byte, scale byte) pair, with ids outside the shard, sorted and unsorted, from device
   memory and from registered host memory; upstream's FP8 kernel against the CPU engine's table.
2. **Lookup time** per call, CUDA events, median over rotating random id sets (so rows are not
   served from L2): a decode step (batch 1 / 32 / 128 tokens x 24 rows) and an 8k-token prefill
   chunk (8192 x 24 rows), from one TP=4 rank's layer-1 shard (96,000,564 rows: 12.16 GiB MXFP4,
   23.60 GiB FP8) in device memory, in torch-pinned host memory (its allocator rounds up to a
   power of two) and in mmap + cudaHostRegister host memory (the exact size, as upstream's
   host table), ids sorted (`sort_ids`) and unsorted. The FP8 peer is upstream SGLang 0.5.23's
   own `engram_gather` kernel, loaded from a copy of its file (`--upstream-kernel`, never part of
   this repository); without it the FP8 rows are gathered and decoded by torch (a stand-in that
   keeps the smoke run's ratios defined, not a kernel peer). Tables are held as upstream holds
   them, a values array and a scales array (the one layout, `formats.engram`).
3. **CUDA graphs**: capture of the MXFP4 gather (sorted and unsorted), replay == eager, replay time.

Writes `gpu_engram.json` (under `--out`, default benchmarks/results/) and prints a table with
the MXFP4 / FP8 time ratio per mode (goal: <= 1 everywhere).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import mmap
import os
import platform
import statistics
import sys
import time
from pathlib import Path

if "--smoke" in sys.argv:  # must precede the triton import
    os.environ.setdefault("TRITON_INTERPRET", "1")

import torch

from sglang_ds41.engram.layout import HEAD_DIM
from sglang_ds41.engram.split_gather import mxfp4_gather, mxfp4_rows, nvfp4_gather, nvfp4_rows
from sglang_ds41.formats.engram import FP8, MXFP4, NVFP4, engram_format

RESULTS = Path(__file__).resolve().parent / "results"
DIM = HEAD_DIM  # official engram_head_dim (256)
FP8_BLOCK = FP8.scale_block  # values per E8M0 scale of an FP8 row (32)
NV_GLOBAL_SCALE = 0.01  # the NVFP4 tables' float32 global scale (any finite value: timing only)
ROWS_PER_TOKEN = 24  # hash columns of one Engram layer
RANK_ROWS = 96_000_564  # TP=4 rank 0 of layer 1 (MODEL.md §9.2)
DECODE_BATCHES = (1, 32, 128)
PREFILL_TOKENS = 8192


# ---- tables ---------------------------------------------------------------------------------


class Table:
    """One table in one memory kind: the raw bytes, the values array then the scales array."""

    def __init__(self, fmt: str, rows: int, memory: str, device: torch.device):
        self.fmt, self.rows, self.memory = fmt, rows, memory
        layout = engram_format(fmt)
        self.value_bytes, self.scale_bytes = layout.value_bytes(DIM), layout.scale_bytes(DIM)
        self.nbytes = rows * (self.value_bytes + self.scale_bytes)
        self._mm = None
        self.registered = False
        if memory == "device":
            self.bytes = torch.empty(self.nbytes, dtype=torch.uint8, device=device)
        elif memory == "torch_pinned":
            self.bytes = torch.empty(self.nbytes, dtype=torch.uint8, pin_memory=device.type == "cuda")
        elif memory == "host_registered":
            self._mm = mmap.mmap(-1, self.nbytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
            if hasattr(mmap, "MADV_HUGEPAGE"):
                self._mm.madvise(mmap.MADV_HUGEPAGE)
            self.bytes = torch.frombuffer(self._mm, dtype=torch.uint8)
        else:
            raise ValueError(memory)
        fill_random(self.bytes, device, self.rows * self.value_bytes)
        if memory == "host_registered" and device.type == "cuda":
            err = torch.cuda.cudart().cudaHostRegister(self.bytes.data_ptr(), self.nbytes, 0)
            if int(err) != 0:
                raise RuntimeError(f"cudaHostRegister({self.nbytes} bytes) failed: {err}")
            self.registered = True

    def close(self) -> None:
        if self.registered:
            torch.cuda.cudart().cudaHostUnregister(self.bytes.data_ptr())
            self.registered = False
        del self.bytes
        if self._mm is not None:
            self._mm.close()

    @property
    def pointers(self) -> tuple[int, int]:
        base = self.bytes.data_ptr()
        return base, base + self.rows * self.value_bytes

    def arrays(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The values and scales arrays as uint8 [rows, bytes per row]."""
        split = self.rows * self.value_bytes
        return (
            self.bytes[:split].view(self.rows, self.value_bytes),
            self.bytes[split:].view(self.rows, self.scale_bytes),
        )


def fill_random(buffer: torch.Tensor, device: torch.device, scales_from: int) -> None:
    """Random bytes, generated on the device in 1 GiB pieces and copied where the buffer lives;
    scale bytes (from offset `scales_from` on) in 100..150 so no row decodes to inf/NaN."""
    step = 1 << 30
    gen = torch.Generator(device=device).manual_seed(0)
    for a in range(0, buffer.numel(), step):
        b = min(a + step, buffer.numel())
        chunk = torch.randint(0, 256, (b - a,), dtype=torch.uint8, device=device, generator=gen)
        buffer[a:b].copy_(chunk)
    region = buffer[scales_from:]
    region.copy_((region.to(device) % 51 + 100).to(region.device))


# ---- kernels --------------------------------------------------------------------------------


def load_upstream_fp8(path: str | None):
    """Upstream's `engram_gather` (FP8 split layout) from a copy of its source file, or None."""
    if not path:
        return None
    spec = importlib.util.spec_from_file_location("upstream_engram_gather", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.engram_gather


def gather_fn(table: Table, upstream_fp8, sort_ids: bool):
    """A function ids -> out for this table."""
    w, s = table.pointers
    if table.fmt == MXFP4.name:
        return lambda ids, out: mxfp4_gather(w, s, ids, out, DIM, row_hi=table.rows, sort_ids=sort_ids)
    if table.fmt == NVFP4.name:
        return lambda ids, out: nvfp4_gather(
            w, s, ids, out, DIM, NV_GLOBAL_SCALE, row_hi=table.rows, sort_ids=sort_ids
        )
    if upstream_fp8 is not None:
        return lambda ids, out: upstream_fp8(
            w, s, ids, out, DIM, FP8_BLOCK, row_hi=table.rows, sort_ids=sort_ids
        )
    values, scales = table.arrays()

    def torch_fp8(ids, out):  # the stand-in peer: gather both arrays, decode by the definition
        rows = ids.to(values.device)
        picked = values[rows].view(FP8.values.torch_dtype()), scales[rows].view(FP8.scales.torch_dtype())
        out.copy_(FP8.dequantize(*picked))
        return out

    return torch_fp8


# ---- timing ---------------------------------------------------------------------------------


def time_calls(fn, id_sets: list[torch.Tensor], out: torch.Tensor, repeats: int) -> float:
    """Median milliseconds per call, over `repeats` calls cycling through `id_sets`."""
    for ids in id_sets[:3]:
        fn(ids, out)  # warm-up (compile, first touch)
    if out.device.type != "cuda":
        samples = []
        for i in range(repeats):
            t0 = time.perf_counter()
            fn(id_sets[i % len(id_sets)], out)
            samples.append((time.perf_counter() - t0) * 1e3)
        return statistics.median(samples)
    torch.cuda.synchronize()
    samples = []
    for i in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn(id_sets[i % len(id_sets)], out)
        end.record()
        end.synchronize()
        samples.append(start.elapsed_time(end))
    return statistics.median(samples)


def id_sets(rows: int, n: int, count: int, device: torch.device) -> list[torch.Tensor]:
    gen = torch.Generator(device=device).manual_seed(n)
    return [torch.randint(0, rows, (n,), device=device, generator=gen) for _ in range(count)]


# ---- correctness ----------------------------------------------------------------------------


def every_pair_table() -> tuple[torch.Tensor, torch.Tensor]:
    """Split MXFP4 rows holding every code byte under every scale byte (DIM 256: 2 rows each)."""
    codes = torch.arange(256, dtype=torch.uint8).view(2, 128)
    weight = codes.repeat(256, 1)
    per_row = MXFP4.scale_bytes(DIM)
    scale = torch.arange(256, dtype=torch.uint8).repeat_interleave(2)[:, None].expand(-1, per_row)
    return weight.contiguous(), scale.contiguous().view(torch.float8_e8m0fnu)


def check_correctness(device: torch.device, upstream_fp8) -> dict[str, object]:
    weight, scale = every_pair_table()
    rows = weight.shape[0]
    results: dict[str, object] = {}
    row_lo = 5
    ids_cpu = torch.cat([torch.arange(row_lo - 3, row_lo + rows + 3), torch.randint(0, rows + 10, (200,))])
    if device.type != "cuda":  # the interpreter is slow: every scale byte, fewer ids
        ids_cpu = torch.arange(row_lo - 3, row_lo + rows + 3)
    local = ids_cpu - row_lo
    want = mxfp4_rows(weight, scale, local, (local >= 0) & (local < rows)).view(torch.int16)
    placements = {"device": (weight.to(device), scale.to(device))}
    if device.type == "cuda":
        placements["pinned_host"] = (weight.pin_memory(), scale.pin_memory())
    for where, (w, s) in placements.items():
        for sort_ids in (False, True):
            ids = ids_cpu.to(device)
            out = torch.empty(ids.numel(), DIM, dtype=torch.bfloat16, device=device)
            mxfp4_gather(w.data_ptr(), s.data_ptr(), ids, out, DIM, row_lo=row_lo, row_hi=row_lo + rows,
                         sort_ids=sort_ids)  # fmt: skip
            same = torch.equal(out.cpu().view(torch.int16), want)
            results[f"mxfp4_split_{where}_{'sorted' if sort_ids else 'unsorted'}_bit_exact"] = same
    # NVFP4 (random codes, every finite E4M3 scale byte) and upstream's FP8 kernel against the
    # CPU engine's table (`EngramTable.lookup`, the formats' decoders)
    from sglang_ds41.engram.table import EngramTable

    gen = torch.Generator().manual_seed(1)
    codes = torch.randint(0, 256, (300, NVFP4.value_bytes(DIM)), generator=gen, dtype=torch.uint8)
    nv_scales = torch.randint(0, 0x7F, (300, NVFP4.scale_bytes(DIM)), generator=gen, dtype=torch.uint8)
    ids = torch.randint(0, 300, (97,), generator=gen)
    owned = torch.ones(97, dtype=torch.bool)
    want = nvfp4_rows(codes, nv_scales.view(torch.float8_e4m3fn), NV_GLOBAL_SCALE, ids, owned)
    w, s = codes.to(device), nv_scales.to(device)
    out = torch.empty(97, DIM, dtype=torch.bfloat16, device=device)
    nvfp4_gather(w.data_ptr(), s.data_ptr(), ids.to(device), out, DIM, NV_GLOBAL_SCALE)
    results["nvfp4_split_device_bit_exact"] = torch.equal(out.cpu().view(torch.int16), want.view(torch.int16))
    if upstream_fp8 is not None:
        values = (torch.randn(300, DIM, generator=gen) * 40).to(torch.float8_e4m3fn)
        scales = torch.randint(110, 140, (300, FP8.scale_bytes(DIM)), generator=gen, dtype=torch.uint8)
        want = EngramTable.from_tensors(values, scales.view(torch.float8_e8m0fnu), pin=False).lookup(ids)
        w, s = values.to(device), scales.to(device)
        upstream_fp8(w.data_ptr(), s.data_ptr(), ids.to(device), out, DIM, FP8_BLOCK)
        results["fp8_upstream_kernel_equals_project_fp8"] = torch.equal(
            out.cpu().view(torch.int16), want.view(torch.int16)
        )
    return results


def check_graph(table: Table, device: torch.device) -> dict[str, object]:
    """Capture the MXFP4 gather in a CUDA graph; replay with new ids == eager; replay time."""
    if device.type != "cuda":
        return {"skipped": "no CUDA device"}
    n = 32 * ROWS_PER_TOKEN
    result: dict[str, object] = {}
    for sort_ids in (False, True):
        fn = gather_fn(table, None, sort_ids)
        static_ids = torch.randint(0, table.rows, (n,), device=device)
        static_out = torch.empty(n, DIM, dtype=torch.bfloat16, device=device)
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for _ in range(3):
                fn(static_ids, static_out)
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            fn(static_ids, static_out)
        fresh = id_sets(table.rows, n, 16, device)
        equal = True
        for ids in fresh[:4]:
            static_ids.copy_(ids)
            graph.replay()
            eager = torch.empty_like(static_out)
            fn(ids, eager)
            torch.cuda.synchronize()
            equal &= torch.equal(static_out.view(torch.int16), eager.view(torch.int16))

        def replay(ids, out, graph=graph, static_ids=static_ids):
            static_ids.copy_(ids)
            graph.replay()

        key = "sorted" if sort_ids else "unsorted"
        result[f"{key}_replay_equals_eager"] = bool(equal)
        result[f"{key}_replay_ms_batch32"] = time_calls(replay, fresh, static_out, 50)
        result[f"{key}_eager_ms_batch32"] = time_calls(fn, fresh, static_out, 50)
    return result


# ---- the run --------------------------------------------------------------------------------


def run(args: argparse.Namespace) -> dict[str, object]:
    device = torch.device("cpu" if args.smoke else "cuda")
    upstream_fp8 = load_upstream_fp8(args.upstream_kernel)
    rows = args.rows or (256 if args.smoke else RANK_ROWS)
    report: dict[str, object] = {
        "machine": {
            "gpu": torch.cuda.get_device_name()
            if device.type == "cuda"
            else "none (smoke run, Triton interpreter)",
            "torch": torch.__version__,
            "triton": __import__("triton").__version__,
            "python": platform.python_version(),
        },
        "rows": rows,
        "fp8_peer": (
            "upstream engram_gather (sglang 0.5.23)" if upstream_fp8 else "torch gather + decode (stand-in)"
        ),
    }
    t0 = time.time()
    report["correctness"] = check_correctness(device, upstream_fp8)
    print("correctness:", json.dumps(report["correctness"]), f"({time.time() - t0:.0f} s)", flush=True)

    # the smoke run only walks every code path: one tiny call of each kind
    decode = (1,) if args.smoke else DECODE_BATCHES
    batches = {f"decode_b{b}": b * ROWS_PER_TOKEN for b in decode}
    batches["prefill_8k"] = (2 if args.smoke else PREFILL_TOKENS) * ROWS_PER_TOKEN
    memories = ("device", "torch_pinned", "host_registered")
    if args.quick:
        memories = ("device", "host_registered")
    timings: list[dict[str, object]] = []
    graph_result: dict[str, object] | None = None
    for memory in memories:
        for fmt in (MXFP4.name, NVFP4.name, FP8.name):
            t1 = time.time()
            try:
                table = Table(fmt, rows, memory, device)
            except (RuntimeError, OSError) as error:
                timings.append({"memory": memory, "format": fmt, "error": str(error)})
                print(f"{memory} {fmt}: {error}", flush=True)
                continue
            setup_s = time.time() - t1
            for sort_ids in (False, True):
                fn = gather_fn(table, upstream_fp8, sort_ids)
                for name, n in batches.items():
                    sets = id_sets(rows, n, 3 if args.smoke else 32, device)
                    out = torch.empty(n, DIM, dtype=torch.bfloat16, device=device)
                    repeats = 1 if args.smoke else (10 if name == "prefill_8k" else 50)
                    ms = time_calls(fn, sets, out, repeats)
                    timings.append({
                        "memory": memory, "format": fmt, "sorted": sort_ids,
                        "call": name, "rows_per_call": n, "ms": ms,
                        "table_gib": table.nbytes / 2**30, "setup_s": setup_s,
                    })  # fmt: skip
            if memory == "device" and fmt == MXFP4.name:
                graph_result = check_graph(table, device)
            table.close()
            print(f"{memory} {fmt}: done in {time.time() - t1:.0f} s", flush=True)
    report["timings"] = timings
    report["cuda_graph"] = graph_result
    report["ratios"] = ratios(timings)
    return report


def ratios(timings: list[dict[str, object]]) -> list[dict[str, object]]:
    """4-bit / FP8 time for each (memory, format, sorted, call); FP8 = the upstream peer."""
    by_key = {(t["memory"], t["format"], t["sorted"], t["call"]): t["ms"] for t in timings if "ms" in t}
    out = []
    for (memory, fmt, sort_ids, call), ms in sorted(by_key.items(), key=str):
        if fmt == FP8.name:
            continue
        peer = by_key.get((memory, FP8.name, sort_ids, call))
        if peer:
            out.append({"memory": memory, "format": fmt, "sorted": sort_ids, "call": call,
                        "fp4_ms": ms, "fp8_ms": peer, "ratio": ms / peer})  # fmt: skip
    return out


def table_text(report: dict[str, object]) -> str:
    lines = [
        f"FP8 peer: {report['fp8_peer']}; rows per rank table: {report['rows']:,}",
        "",
        "| memory | 4-bit format | ids | call | 4-bit ms | FP8 ms | 4-bit/FP8 |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in report["ratios"]:
        lines.append(
            f"| {r['memory']} | {r['format']} | "
            f"{'sorted' if r['sorted'] else 'unsorted'} | {r['call']} | "
            f"{r['fp4_ms']:.4f} | {r['fp8_ms']:.4f} | {r['ratio']:.2f} |"
        )
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument(
        "--upstream-kernel", help="a copy of sglang 0.5.23's kernels/ops/embeddings/engram_gather.py"
    )
    parser.add_argument("--rows", type=int, help=f"rows per table (default {RANK_ROWS:,}, one TP=4 rank)")
    parser.add_argument(
        "--quick", action="store_true", help="skip the torch-pinned tables (saves ~2 minutes)"
    )
    parser.add_argument(
        "--smoke", action="store_true", help="CPU, tiny sizes, Triton interpreter (checks the script)"
    )
    args = parser.parse_args()
    report = run(args)
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / ("gpu_engram_smoke.json" if args.smoke else "gpu_engram.json")
    path.write_text(json.dumps(report, indent=2))
    print(table_text(report))
    print(f"wrote {path}")
    failed = [k for k, v in report["correctness"].items() if v is False]
    if failed:
        print("CORRECTNESS FAILURES:", failed)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
