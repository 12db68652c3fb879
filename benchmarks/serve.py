"""The CPU SGLang server on the tiny checkpoint next to the reference `generate`, in one run.

    .venv/bin/python benchmarks/serve.py [--dtype float32] [--threads 1] [--prompt 128]
        [--decode 16] [--repeats 2] [--batch 8] [--batch-prompt 128] [--batch-output 8]
        [--sglang-args "..."] [--server-log PATH]
        [--scaling | --scaling-only] [--contexts 512,4096,16384,65536] [--batches 1,8,32]
        [--baseline REV]

Starts `sglang-ds41 serve` on `tiny_checkpoint()` (127.0.0.1, a free port, the server's
compute bound to the first --threads cores) and measures, through `/generate` with token ids
(greedy, ignore_eos, distinct random prompts so that the radix cache never hits):

* start: seconds from launch to the first 200 of `/health_generate`; peak summed RSS of the
  server's process tree while it lived;
* single request: prefill tokens/s = P / time(P-token prompt, 1 new token); decode tokens/s =
  D / (time(P, 1 + D) - time(P, 1)), medians of --repeats. Client-side wall time, so HTTP and
  scheduling overhead count, as they do for a user;
* batch: --batch requests of different prompt lengths sent at once -> requests/s and output
  tokens/s over the wall time of the whole batch.

After the server has stopped (so that the two never share the cores), the same prompts go
through the reference model's `generate` in this process with the same thread count, one
request after the other, measured the same way; the table gives server/reference ratios. The
reference is the plain oracle: a ratio above 1 says the server's batching and slot-indexed
state pay off, below 1 what its plumbing costs at this size.

Also reported: the bytes of V4.1 state of the backend's slot layout (`backend.kv_state.
kv_bytes_per_token`, rows packed in the model's KV formats, so the same in every dtype): per
token of context (compressed entries + token id) next to the model's native 890 B/token (MODEL.md
§4.6), and the window KV, which SGLang's sliding-window pool holds per request, not per token;
and what SGLang's pools allocate for it (they are given our rows as their geometry).

With --scaling (or --scaling-only, which skips everything above), a second server measures
how the decode step grows with the context and the batch and what a long prefill costs in
memory (`serve_scaling.py`: contexts 512 .. 64k, batches 1, 8, 32, on a benchmark-only variant
of the tiny checkpoint with 131,072 positions). --baseline REV first measures the same with the
server of git revision REV (its sglang_ds41 from `git archive REV`), for before / after in one
run.

Writes `benchmarks/results/serve.json` and prints a short markdown table.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import shlex
import statistics
import sys
import tempfile
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import serve_scaling
import torch

from sglang_ds41.backend.kv_codec import window_codec
from sglang_ds41.backend.kv_state import kv_bytes_per_token, slot_row_geometry
from sglang_ds41.cache import tiny_checkpoint
from sglang_ds41.config import V41Config
from sglang_ds41.errors import Ds41Error
from sglang_ds41.reference.generate import generate
from sglang_ds41.reference.weights import load_reference
from sglang_ds41.serve.launcher import omp_bind, split_flags
from sglang_ds41.serve.server_process import running_server

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results" / "serve.json"
OFFICIAL_CONFIG = ROOT / "tests" / "fixtures" / "official_config.json"
NATIVE_BYTES_PER_TOKEN = 890  # MODEL.md §4.6: FP4 latents + FP4 index keys of the global KV
DTYPES = {"float64": torch.float64, "float32": torch.float32, "bfloat16": torch.bfloat16}
ONE_M = 2**20


class Prompts:
    """Distinct random prompts (BOS first): every call a fresh one, so no radix-cache hits."""

    def __init__(self, seed: int = 0) -> None:
        self.generator = torch.Generator().manual_seed(seed)

    def __call__(self, n: int) -> list[int]:
        ids = torch.randint(3, 128000, (n,), generator=self.generator)
        ids[0] = 0
        return ids.tolist()


class ServerClient:
    """`POST /generate` with token ids, greedy and ignore_eos; returns (output ids, seconds)."""

    def __init__(self, url: str, timeout_s: float) -> None:
        self.url, self.timeout_s = url, timeout_s
        self.cached_tokens = 0

    def __call__(self, ids: list[int], steps: int) -> tuple[list[int], float]:
        sampling = {"max_new_tokens": steps, "temperature": 0, "ignore_eos": True}
        body = {"input_ids": ids, "sampling_params": sampling}
        request = urllib.request.Request(
            self.url + "/generate", json.dumps(body).encode(), {"Content-Type": "application/json"}
        )
        start = time.perf_counter()
        with urllib.request.urlopen(request, timeout=self.timeout_s) as reply:
            out = json.loads(reply.read())
        seconds = time.perf_counter() - start
        self.cached_tokens += out["meta_info"].get("cached_tokens", 0)
        if len(out["output_ids"]) != steps:
            raise Ds41Error(f"/generate returned {len(out['output_ids'])} tokens, expected {steps}")
        return out["output_ids"], seconds


class ReferenceClient:
    """The same call on the reference model in this process."""

    def __init__(self, model) -> None:
        self.model = model

    def __call__(self, ids: list[int], steps: int) -> tuple[list[int], float]:
        start = time.perf_counter()
        out = generate(self.model, ids, steps)
        return out, time.perf_counter() - start


def single(run, prompts: list[list[int]], decode: int) -> dict:
    """Prefill and decode tokens/s of one request at a time; `prompts` come in pairs per repeat
    (one for the 1-token call, one for the 1 + D call: a repeated prompt would hit the cache)."""
    prefill_s, decode_s = [], []
    for short, long in zip(prompts[::2], prompts[1::2], strict=True):
        _, t1 = run(short, 1)
        _, tn = run(long, 1 + decode)
        prefill_s.append(t1)
        decode_s.append(max(tn - t1, 1e-9))
    n = len(prompts[0])
    return {
        "prefill_tokens_per_s": n / statistics.median(prefill_s),
        "decode_tokens_per_s": decode / statistics.median(decode_s),
        "prefill_s": prefill_s,
        "decode_s": decode_s,
    }


def batch(run, prompts: list[list[int]], steps: int, concurrent: bool) -> dict:
    """All `prompts` at once (server) or one after the other (reference)."""
    start = time.perf_counter()
    if concurrent:
        with ThreadPoolExecutor(len(prompts)) as pool:
            outs = list(pool.map(lambda ids: run(ids, steps)[0], prompts))
    else:
        outs = [run(ids, steps)[0] for ids in prompts]
    wall = time.perf_counter() - start
    return {
        "wall_s": wall,
        "requests_per_s": len(prompts) / wall,
        "output_tokens_per_s": len(prompts) * steps / wall,
        "outputs": outs,
    }


def batch_lengths(count: int, longest: int, shortest: int = 8) -> list[int]:
    """`count` prompt lengths spread evenly from `shortest` to `longest`, longest first."""
    if count == 1:
        return [longest]
    return [round(longest - i * (longest - shortest) / (count - 1)) for i in range(count)]


def kv_report(tiny_dir: Path) -> dict:
    """State bytes of the slot layout. Under SGLang's sliding-window pool (what `serve` runs)
    window rows are held for the last window of each request / cached prefix only; the
    compressed entries and token ids are held for every token of context."""
    tiny = kv_bytes_per_token(V41Config.from_file(tiny_dir).text)
    official_cfg = V41Config.from_file(OFFICIAL_CONFIG).text
    official, window = kv_bytes_per_token(official_cfg), official_cfg.sliding_window
    per_context_token = official["compressed"] + official["token_id"]
    window_per_request = official["window"] * window
    # SGLang's pools (layer 0 "full", the rest "SWA") get our rows as their geometry
    # (launch_hooks): what it allocates and counts per token, in bf16 elements, vs what is used;
    # layer 0's window rows are a buffer of ours beside them, uncounted by SGLang's sizing.
    full_k, swa_k = slot_row_geometry(official_cfg, 2)
    sglang_row, sglang_swa_slot = 2 * full_k, 2 * swa_k * (official_cfg.num_hidden_layers - 1)
    ours_per_swa_slot = official["window"] - window_codec(official_cfg.head_dim).row_bytes
    return {
        "tiny": tiny,
        "official": {
            **official,
            "per_context_token": per_context_token,
            "native_bytes_per_token": NATIVE_BYTES_PER_TOKEN,
            "vs_native": per_context_token / NATIVE_BYTES_PER_TOKEN,
            "window_bytes_per_request": window_per_request,
            "gib_per_1m_token_sequence": (per_context_token * ONE_M + window_per_request) / 2**30,
            "native_gib_per_1m_token_sequence": NATIVE_BYTES_PER_TOKEN * ONE_M / 2**30,
            "without_window_pool_gib_per_1m_token_sequence": official["total"] * ONE_M / 2**30,
            "sglang_pool_bytes_per_token": sglang_row,
            "sglang_pool_bytes_per_swa_slot": sglang_swa_slot,
            "sglang_pool_unused_bytes_per_token": sglang_row - per_context_token,
            "sglang_pool_unused_bytes_per_swa_slot": sglang_swa_slot - ours_per_swa_slot,
            "own_buffer_bytes_per_swa_slot_layer0_window": official["window"] - ours_per_swa_slot,
            "tp_note": "every TP rank holds this state whole (one shared KV head, as in SGLang's V4)",
        },
    }


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dtype", choices=sorted(DTYPES), default="float32",
                        help="SGLANG_DS41_DTYPE of the server and dtype of the reference")  # fmt: skip
    parser.add_argument("--threads", type=int, default=1, help="cores for the server / torch threads")
    parser.add_argument("--prompt", type=int, default=128, help="prompt tokens of the single-request runs")
    parser.add_argument("--decode", type=int, default=16, help="decode steps of the single-request runs")
    parser.add_argument("--repeats", type=int, default=2, help="single-request repeats (median)")
    parser.add_argument("--batch", type=int, default=8, help="concurrent requests (1..64)")
    parser.add_argument("--batch-prompt", type=int, default=128, help="longest prompt of the batch")
    parser.add_argument("--batch-output", type=int, default=8, help="new tokens per batch request")
    parser.add_argument("--request-timeout", type=float, default=300.0, help="seconds per HTTP request")
    parser.add_argument("--ready-timeout", type=float, default=600.0, help="seconds to wait for the server")
    parser.add_argument("--sglang-args", default="", help='more sglang flags: "--max-total-tokens 8192"')
    parser.add_argument("--server-log", type=Path, help="keep the server's log here (default: dropped)")
    parser.add_argument("--output", type=Path, default=RESULTS)
    parser.add_argument("--scaling", action="store_true", help="also: decode step vs context and batch")
    parser.add_argument("--scaling-only", action="store_true", help="only the --scaling measurements")
    parser.add_argument("--contexts", type=_ints, default=serve_scaling.CONTEXTS,
                        help="prompt tokens of the decode-vs-context runs")  # fmt: skip
    parser.add_argument("--batches", type=_ints, default=serve_scaling.BATCHES,
                        help="concurrent requests of the decode-vs-batch runs")  # fmt: skip
    parser.add_argument("--scaling-decode", type=int, default=24, help="tokens per scaling request")
    parser.add_argument("--scaling-prompt", type=int, default=512, help="prompt of the batch runs")
    parser.add_argument("--baseline", metavar="REV",
                        help="--scaling first for the server of git revision REV (before/after)")  # fmt: skip
    args = parser.parse_args(argv)
    if not 1 <= args.batch <= 64:
        parser.error(f"--batch must be in 1..64, got {args.batch}")
    if min(args.prompt, args.decode, args.repeats, args.batch_prompt, args.batch_output, args.threads) < 1:
        parser.error("sizes, repeats and threads must be positive")
    return args


def _ints(text: str) -> tuple[int, ...]:
    return tuple(int(part) for part in text.split(","))


def server_setup(args: argparse.Namespace) -> tuple[list[str], dict[str, str], list[int]]:
    """(extra sglang flags, server environment, the cores) of every server this run starts."""
    sglang_args = shlex.split(args.sglang_args)
    if any(item[0] in ("--host", "--port", "--model-path") for item in split_flags(sglang_args)):
        raise Ds41Error("--sglang-args: the benchmark chooses --host 127.0.0.1, the port and the model")
    cpus = sorted(os.sched_getaffinity(0))[: args.threads]
    torch.set_num_threads(len(cpus))
    env = {"SGLANG_DS41_DTYPE": args.dtype, "SGLANG_CPU_OMP_THREADS_BIND": omp_bind(1, cpus)}
    return sglang_args, env, cpus


def measure_scaling(args: argparse.Namespace, code: Path | None = None) -> dict:
    """Decode step vs context and batch, prefill memory vs context (`serve_scaling.py`); with
    `code`, the server imports sglang_ds41 from that source tree (a --baseline revision)."""
    sglang_args, env, cpus = server_setup(args)
    if code is not None:
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(code), os.environ.get("PYTHONPATH")) if p)
    model_dir = serve_scaling.long_context_checkpoint(tiny_checkpoint())
    tokens = max(max(args.contexts) + args.scaling_decode, max(args.batches) * (args.scaling_prompt + 64))
    flags = ["--max-total-tokens", str(tokens + 4096), "--chunked-prefill-size", "4096"]
    flags += ["--max-running-requests", str(max(max(args.batches), 8))]
    make = Prompts(seed=1)
    text = V41Config.from_file(model_dir / "config.json").text
    state = kv_bytes_per_token(text)
    per_token = state["compressed"] + state["token_id"]  # the window pool holds the last window only
    with tempfile.TemporaryDirectory(prefix="bench-scaling-") as tmp:
        log = args.server_log or Path(tmp) / "server.log"
        with running_server(
            model_dir, [*flags, *sglang_args], log_path=log, env=env, ready_timeout_s=args.ready_timeout
        ) as server:
            url, timeout = server.url, args.request_timeout
            serve_scaling.stream_generate(url, make(args.scaling_prompt), 4, timeout)  # warm-up
            rss = serve_scaling.TreeRss(server.proc.pid)
            contexts = serve_scaling.by_context(
                url, rss, make, args.contexts, args.scaling_decode, timeout, per_token
            )
            batches = serve_scaling.by_batch(
                url, make, args.batches, args.scaling_prompt, args.scaling_decode, timeout
            )
    by_n = {row["context_tokens"]: row for row in contexts}
    short = by_n.get(min(args.contexts))
    for row in contexts:
        row["decode_step_vs_shortest"] = row["decode_step_ms"] / short["decode_step_ms"]
    return {
        "model": f"{model_dir.name} (the tiny checkpoint with {serve_scaling.LONG_CONTEXT} positions)",
        "threads": len(cpus),
        "server_flags": [*flags, *sglang_args],
        "state_bytes_per_context_token": per_token,
        "decode_tokens_per_request": args.scaling_decode,
        "by_context": contexts,
        "by_batch": batches,
    }


def measure(args: argparse.Namespace) -> dict:
    dtype = DTYPES[args.dtype]
    sglang_args, env, cpus = server_setup(args)
    model_dir = tiny_checkpoint()

    make = Prompts(seed=0)
    single_prompts = [make(args.prompt) for _ in range(2 * args.repeats)]
    lengths = batch_lengths(args.batch, args.batch_prompt)
    batch_prompts = [make(n) for n in lengths]
    warmup = make(16)

    load_before = os.getloadavg()[0]
    with tempfile.TemporaryDirectory(prefix="bench-serve-") as tmp:
        log = args.server_log or Path(tmp) / "server.log"
        with running_server(
            model_dir, sglang_args, log_path=log, env=env, ready_timeout_s=args.ready_timeout
        ) as server:
            client = ServerClient(server.url, args.request_timeout)
            client(warmup, 2)
            server_single = single(client, single_prompts, args.decode)
            server_batch = batch(client, batch_prompts, args.batch_output, concurrent=True)
        if not server.stopped_cleanly:
            print(f"warning: the server did not stop cleanly:\n{server.log_tail(20)}", file=sys.stderr)
        start = {
            "ready_s": server.ready_s,
            "peak_rss_gib": server.peak_rss_gib,
            "stopped_cleanly": server.stopped_cleanly,
        }

    reference = ReferenceClient(load_reference(model_dir, dtype))
    reference(warmup, 2)
    ref_single = single(reference, single_prompts, args.decode)
    ref_batch = batch(reference, batch_prompts, args.batch_output, concurrent=False)

    same = sum(a == b for a, b in zip(server_batch.pop("outputs"), ref_batch.pop("outputs"), strict=True))
    import sglang

    return {
        "model": f"tiny_checkpoint() {model_dir.name} (8 layers, hidden 64, vocab 129280)",
        "dtype": args.dtype,
        "threads": len(cpus),
        "sglang_args": sglang_args,
        "sglang": sglang.__version__,
        "torch": torch.__version__,
        "machine": platform.machine(),
        # the cores are shared: a busy machine slows both sides, not always equally
        "load_average_1m": {"start": load_before, "end": os.getloadavg()[0]},
        "server": {**start, "cached_prompt_tokens": client.cached_tokens},
        "reference_process_peak_rss_gib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20,
        "single": {
            "prompt_tokens": args.prompt,
            "decode_tokens": args.decode,
            "repeats": args.repeats,
            "server": server_single,
            "reference": ref_single,
        },
        "batch": {
            "requests": args.batch,
            "prompt_tokens": lengths,
            "output_tokens_each": args.batch_output,
            "server": server_batch,
            "reference": ref_batch,
            "greedy_outputs_equal_reference": f"{same}/{args.batch}",
        },
        "kv_state_bytes_per_token": kv_report(model_dir),
    }


ROWS = [
    ("single: prefill tokens/s", "single", "prefill_tokens_per_s"),
    ("single: decode tokens/s", "single", "decode_tokens_per_s"),
    ("batch: requests/s", "batch", "requests_per_s"),
    ("batch: output tokens/s", "batch", "output_tokens_per_s"),
]


def _num(x: float) -> str:
    return f"{x:.1f}" if x >= 10 else f"{x:.2f}"


def table(result: dict) -> str:
    s, b = result["single"], result["batch"]
    lines = [
        f"tiny model, {result['dtype']}, {result['threads']} thread(s); single: {s['prompt_tokens']}-token "
        f"prompt, {s['decode_tokens']} decode steps; batch: {b['requests']} concurrent requests "
        f"({min(b['prompt_tokens'])}..{max(b['prompt_tokens'])} prompt tokens, "
        f"{b['output_tokens_each']} new each)",
        "",
        "| metric | server | reference | server / reference |",
        "|---|---|---|---|",
    ]
    for label, part, key in ROWS:
        ours, ref = result[part]["server"][key], result[part]["reference"][key]
        lines.append(f"| {label} | {_num(ours)} | {_num(ref)} | {ours / ref:.2f} |")
    srv, kv = result["server"], result["kv_state_bytes_per_token"]
    official = kv["official"]
    window_mib = official["window_bytes_per_request"] / 2**20
    lines += [
        f"| server start (launch -> ready) | {srv['ready_s']:.1f} s | | |",
        f"| server peak RSS (process tree) | {srv['peak_rss_gib']:.2f} GiB | | |",
        f"| batch greedy outputs == reference | {b['greedy_outputs_equal_reference']} | | |",
        f"| KV state B/token of context, official | {official['per_context_token']:.0f} "
        f"| native {NATIVE_BYTES_PER_TOKEN} | {official['vs_native']:.3f}x native |",
        f"| window KV per request (SWA pool), official | {window_mib:.2f} MiB | | |",
        f"| 1M-token sequence, official | {official['gib_per_1m_token_sequence']:.2f} GiB "
        f"| native {official['native_gib_per_1m_token_sequence']:.2f} GiB | without the SWA pool: "
        f"{official['without_window_pool_gib_per_1m_token_sequence']:.1f} GiB |",
        "| SGLang's K pools (hold the state), official "
        f"| {official['sglang_pool_bytes_per_token']} B/token + "
        f"{official['sglang_pool_bytes_per_swa_slot']:,} B per SWA slot "
        f"| unused: {official['sglang_pool_unused_bytes_per_token']:.0f} + "
        f"{official['sglang_pool_unused_bytes_per_swa_slot']} "
        f"| layer 0's window beside them: {official['own_buffer_bytes_per_swa_slot_layer0_window']} "
        "B per SWA slot |",
    ]
    return "\n".join(lines)


def scaling_table(result: dict, key: str = "scaling") -> str:
    s = result[key]
    code = f"revision {s['revision']}" if "revision" in s else "this tree"
    lines = [
        f"scaling ({code}): {s['model']}, {result['dtype']}, {s['threads']} thread(s), "
        f"{s['decode_tokens_per_request']} new tokens per request",
        "",
        "| context tokens | decode step ms | vs shortest | prefill tok/s | prefill RSS growth MiB "
        "| state of the prompt MiB | load avg |",
        "|---|---|---|---|---|---|---|",
    ]
    for row in s["by_context"]:
        lines.append(
            f"| {row['context_tokens']} | {row['decode_step_ms']:.1f} | {row['decode_step_vs_shortest']:.2f} "
            f"| {row['prefill_tokens_per_s']:.0f} | {row['prefill_rss_growth_mib']:.0f} "
            f"| {row['state_of_the_prompt_mib']:.1f} | {row['load_average_1m']:.1f} |"
        )
    lines += [
        "",
        "| batch | decode step ms | decode tokens/s | vs batch 1 | load avg |",
        "|---|---|---|---|---|",
    ]
    for row in s["by_batch"]:
        ratio = row["tokens_per_s_vs_batch_1"]
        lines.append(
            f"| {row['batch']} | {row['decode_step_ms']:.1f} | {row['decode_tokens_per_s']:.1f} "
            f"| {'' if ratio is None else f'{ratio:.2f}'} | {row['load_average_1m']:.1f} |"
        )
    return "\n".join(lines)


def source_tree(rev: str, into: Path) -> Path:
    """`git archive` of revision `rev` of this repository, unpacked under `into`."""
    import subprocess

    tree = into / "baseline"
    tree.mkdir()
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", rev], capture_output=True, check=False)
    if archive.returncode:
        raise Ds41Error(f"--baseline {rev}: {archive.stderr.decode().strip()}")
    subprocess.run(["tar", "-x", "-C", str(tree)], input=archive.stdout, check=True)
    return tree


def measure_baseline(args: argparse.Namespace) -> dict:
    with tempfile.TemporaryDirectory(prefix="bench-baseline-") as tmp:
        return {"revision": args.baseline, **measure_scaling(args, source_tree(args.baseline, Path(tmp)))}


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        result = {"dtype": args.dtype} if args.scaling_only else measure(args)
        if args.baseline and (args.scaling or args.scaling_only):
            result["scaling_baseline"] = measure_baseline(args)
        if args.scaling or args.scaling_only:
            result["scaling"] = measure_scaling(args)
    except Ds41Error as error:
        print(f"benchmarks/serve.py: {error}", file=sys.stderr)
        return 1
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(result, indent=2) + "\n")
    if not args.scaling_only:
        print(table(result))
    if "scaling_baseline" in result:
        print(scaling_table(result, "scaling_baseline"))
    if "scaling" in result:
        print(scaling_table(result))
    print(f"wrote {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
