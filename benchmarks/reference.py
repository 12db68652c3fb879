"""Reference-model CPU throughput: prefill and decode tokens/s of a tiny checkpoint.

    .venv/bin/python benchmarks/reference.py [--prefill 64,256] [--decode 32] [--threads 1]

Writes a `make-tiny` checkpoint (MODEL.md §11 shapes, real vocabulary) to a temporary
directory, loads it with `reference.weights.load_reference`, and measures per dtype:

* prefill: one forward over N prompt tokens on a fresh state, tokens/s (median of --repeats);
* decode: --decode single-token steps after a prefill of the largest N, tokens/s.

The reference is the plain oracle, not a fast path: these numbers say how long tests and
`sglang-ds41 generate` take, nothing about serving. Writes `benchmarks/results/reference.json`
and prints a short markdown table.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import tempfile
import time
from pathlib import Path

import torch

from sglang_ds41.checkpoint.tiny import write_tiny
from sglang_ds41.reference.weights import load_reference

RESULTS = Path(__file__).resolve().parent / "results" / "reference.json"


def _prompt(n: int) -> torch.Tensor:
    ids = torch.randint(3, 128000, (n,), generator=torch.Generator().manual_seed(0))
    ids[0] = 0
    return ids


def bench_prefill(model, n: int, repeats: int) -> float:
    ids = _prompt(n)
    model(ids, model.new_state())  # warm-up
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        model(ids, model.new_state())
        times.append(time.perf_counter() - start)
    return n / statistics.median(times)


def bench_decode(model, prefill: int, steps: int) -> float:
    state = model.new_state()
    token = int(model(_prompt(prefill), state)[-1].argmax())
    start = time.perf_counter()
    for _ in range(steps):
        token = int(model(torch.tensor([token]), state)[-1].argmax())
    return steps / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prefill", default="64,256", help="comma-separated prompt lengths")
    parser.add_argument("--decode", type=int, default=32, help="decode steps")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--dtypes", default="float32,float64")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    lengths = [int(n) for n in args.prefill.split(",")]
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        ckpt = write_tiny(Path(tmp) / "tiny")
        for name in args.dtypes.split(","):
            model = load_reference(ckpt, getattr(torch, name), token_map_cache=Path(tmp) / "token-map")
            for n in lengths:
                rows.append({"dtype": name, "phase": "prefill", "tokens": n,
                             "tokens_per_s": bench_prefill(model, n, args.repeats)})  # fmt: skip
            rows.append({"dtype": name, "phase": "decode", "tokens": args.decode, "context": max(lengths),
                         "tokens_per_s": bench_decode(model, max(lengths), args.decode)})  # fmt: skip
    result = {
        "model": "make-tiny (8 layers, hidden 64, vocab 129280)",
        "threads": args.threads,
        "torch": torch.__version__,
        "machine": platform.machine(),
        "processor": platform.processor(),
        "results": rows,
    }
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(result, indent=2) + "\n")
    print(f"| dtype | phase | tokens | tokens/s |  (threads={args.threads})")
    print("|---|---|---|---|")
    for r in rows:
        print(f"| {r['dtype']} | {r['phase']} | {r['tokens']} | {r['tokens_per_s']:.1f} |")
    print(f"wrote {RESULTS}")


if __name__ == "__main__":
    main()
