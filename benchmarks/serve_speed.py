"""How fast the CPU engine's step is, next to plain PyTorch and upstream SGLang doing the same work.

    .venv/bin/python benchmarks/serve_speed.py [--sizes tiny,trained,shipped]
        [--contexts 512,4096,16384] [--batches 1,4,16] [--steps 16] [--repeats 3] [--no-served]
        [--no-sglang-peer]

Three models: `tiny` (the tiny checkpoint: hidden 64, 4 heads, window 8, top-k 4), `trained`
(random weights in the trained model's shape, `training.config.TRAINED_TEXT`: hidden 128,
4 heads x 64, window 128, top-k 1024, candidate blocks 8 x 128, YaRN from 2,048 to 32,768,
Engram tables of ~96k rows; every head row nonzero, as in a real checkpoint) and `shipped`
(the embedded default itself, `serve --tiny`: that shape with its trained weights, whose head
is computed over its ~25k nonzero rows, `fast/head.py`; the peer's head has all 129,280).
All have the real 129,280-id vocabulary and 8 layers with the tiny layer roles. float32, one
thread, as `serve` and `generate` compute by default.

Per size, in one run (peers measured in the same process / on the same cores, interleaved
where they can be, so load hits both):

* **model** (in process, no server): our backend forward (`DeepseekV41ForCausalLM` over a slot
  store, as the server runs it) against `llama_peer.LlamaPeer`, an eager PyTorch Llama of the
  same dimensions and vocabulary with a KV cache: the decode step at batch 1 for every
  context and at context 512 for every batch (prompts prefilled first), and prefill tokens/s
  of one request per context (chunks of 4,096, as the server's chunked prefill). Each number:
  min and median over --repeats runs of the median of --steps steps. Then **where our step's
  time goes** (`PHASES`, wall time per step inside each, the rest as "other").
* **served**: `sglang-ds41 serve` against upstream SGLang serving the peer as a Hugging Face
  Llama checkpoint through its own `LlamaForCausalLM` (same CPU engine settings; skipped with
  --no-sglang-peer), through streamed `/generate`: decode step and time to first token per
  context (batch 1), decode step and aggregate tokens/s per batch (context 512).

Goals (issue 25), as ratios in this run: model decode step at batch 1 / context 512 <= 1.5x
the peer's; batch-16 aggregate decode tokens/s >= 8x batch 1's; the step at the longest
context <= 1.2x the 512 one; prefill tokens/s >= 0.5x the peer's.

Writes `benchmarks/results/serve_speed.json` and prints short tables.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import serve_scaling
import torch
from llama_peer import LlamaPeer, PeerDims, write_hf_llama

from sglang_ds41 import cache
from sglang_ds41.assets import TOKENIZER_DIR
from sglang_ds41.backend.kv_state import SlotState, Span
from sglang_ds41.backend.model import DeepseekV41ForCausalLM
from sglang_ds41.checkpoint.tiny import write_tiny
from sglang_ds41.config import V41Config
from sglang_ds41.errors import Ds41Error
from sglang_ds41.serve import launcher
from sglang_ds41.serve.server_process import free_port, running_server
from sglang_ds41.training.config import TRAINED_TEXT

RESULTS = Path(__file__).resolve().parent / "results" / "serve_speed.json"
PAGE = 2  # `serve`'s --page-size
CHUNK = 4096  # prefill chunk, as the served runs' --chunked-prefill-size

def checkpoint(size: str) -> Path:
    """The checkpoint of `size`, built once into the cache (the tiny one with 131,072 positions)."""
    if size == "tiny":
        return serve_scaling.long_context_checkpoint(cache.tiny_checkpoint())
    if size == "shipped":
        return cache.trained_tiny_checkpoint()
    key = hashlib.sha256(json.dumps(TRAINED_TEXT, sort_keys=True).encode()).hexdigest()[:12]
    target = cache.cache_dir() / f"speed-trained-{key}"
    return cache.cached_checkpoint(target, lambda out: write_tiny(out, overrides=TRAINED_TEXT))


def prompt(n: int, generator: torch.Generator) -> list[int]:
    ids = torch.randint(3, 128000, (n,), generator=generator)
    ids[0] = 0
    return ids.tolist()


def spread(samples: list[float]) -> dict[str, float]:
    return {"min": min(samples), "median": statistics.median(samples)}


# --- in process -------------------------------------------------------------------------------


class Requests:
    """SGLang's slot bookkeeping for the model outside a server: pages of PAGE slots, one row of
    slot ids per request (`tests/backend/_slots.py` does the same with prefix sharing)."""

    def __init__(self, model: DeepseekV41ForCausalLM, batch: int, length: int):
        rows = batch * (length + PAGE) + 2 * PAGE
        self.model, self.store = model, SlotState(model.v41.text, rows, batch + 1, model.dtype)
        self.slots = torch.arange(PAGE, PAGE + batch * (length + PAGE)).view(batch, -1)  # whole pages
        self.length = [0] * batch

    def forward(self, parts: list[tuple[int, list[int]]]) -> torch.Tensor:
        """One forward of (request, new ids) parts -> next-token logits [parts, vocab]."""
        spans, offset = [], 0
        for b, new in parts:
            start, self.length[b] = self.length[b], self.length[b] + len(new)
            spans.append(Span(b, start, len(new), offset, self.slots[b, : self.length[b]]))
            offset += len(new)
        ids = torch.tensor([i for _, new in parts for i in new])
        positions = torch.cat([torch.arange(s.start, s.end) for s in spans])
        loc = torch.cat([s.new_slots for s in spans])
        return self.model.next_token_logits(ids, positions, loc, spans, self.store)

    def prefill(self, b: int, ids: list[int]) -> torch.Tensor:
        for c in range(0, len(ids), CHUNK):
            logits = self.forward([(b, ids[c : c + CHUNK])])
        return logits


@dataclass
class Case:
    """One decode case of both models: B requests at `context` tokens each."""

    batch: int
    context: int
    ours: list[float] = field(default_factory=list)  # per repeat: median step seconds
    peer: list[float] = field(default_factory=list)
    ours_prefill: list[float] = field(default_factory=list)  # per repeat: seconds for one request
    peer_prefill: list[float] = field(default_factory=list)


def run_case(model, peer: LlamaPeer, case: Case, steps: int, generator: torch.Generator) -> None:
    """Prefill every request, then `steps` decode steps of all together, ours and the peer's
    interleaved step by step."""
    b, n = case.batch, case.context
    prompts = [prompt(n, generator) for _ in range(b)]
    ours = Requests(model, b, n + steps + 4)
    peer.reset(b, n + steps + 4)
    t0 = time.perf_counter()
    tokens = [int(ours.prefill(i, ids)[0].argmax()) for i, ids in enumerate(prompts)]
    case.ours_prefill.append((time.perf_counter() - t0) / b)
    t0 = time.perf_counter()
    for c in range(0, n, CHUNK):
        logits = peer(torch.tensor([ids[c : c + CHUNK] for ids in prompts]), c)
    case.peer_prefill.append((time.perf_counter() - t0) / b)
    peer_tokens, at = logits.argmax(-1, keepdim=True), n
    mine, theirs = [], []
    for _ in range(steps):
        t0 = time.perf_counter()
        logits = ours.forward([(i, [t]) for i, t in enumerate(tokens)])
        tokens = logits.argmax(-1).tolist()
        mine.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        peer_tokens = peer(peer_tokens, at).argmax(-1, keepdim=True)
        at += 1
        theirs.append(time.perf_counter() - t0)
    case.ours.append(statistics.median(mine))
    case.peer.append(statistics.median(theirs))


# Where a step's time goes: (label, module, object path, attribute); inclusive wall time of
# each, measured by wrapping it. They do not nest, so "other" is the step minus their sum.
PHASES = [
    ("engram hashing", "sglang_ds41.backend.model", "DeepseekV41Model", "engram_rows"),
    ("engram gate", "sglang_ds41.engram.layer", "EngramLayer", "forward"),
    ("mHC coefficients", "sglang_ds41.fast.mhc", "", "coefficients"),
    ("mHC collapse + norm", "sglang_ds41.fast.mhc", "", "collapse_norm"),
    ("mHC expand", "sglang_ds41.fast.mhc", "", "expand"),
    ("attention project", "sglang_ds41.fast.attention", "", "project"),
    ("attention commit", "sglang_ds41.backend.kv_state", "SlotState", "commit"),
    ("attention select", "sglang_ds41.fast.attention", "", "select"),
    ("attention attend", "sglang_ds41.fast.attention", "", "attend"),
    ("MoE", "sglang_ds41.fast.moe", "", "forward"),
]


@contextlib.contextmanager
def timed_phases() -> Iterator[dict[str, float]]:
    """Wraps every PHASES entry with a timer while the block runs; yields label -> seconds."""
    import importlib

    spent: dict[str, float] = {label: 0.0 for label, *_ in PHASES}
    undo = []
    for label, module, path, attr in PHASES:
        owner = importlib.import_module(module)
        for part in filter(None, path.split(".")):
            owner = getattr(owner, part)
        original = owner.__dict__[attr] if isinstance(owner, type) else getattr(owner, attr)

        def timed(*args, _f=original, _label=label, **kwargs):
            t0 = time.perf_counter()
            try:
                return _f(*args, **kwargs)
            finally:
                spent[_label] += time.perf_counter() - t0

        setattr(owner, attr, timed)
        undo.append((owner, attr, original))
    try:
        yield spent
    finally:
        for owner, attr, original in reversed(undo):
            setattr(owner, attr, original)


def profile_step(model, batch: int, context: int, steps: int, generator: torch.Generator) -> dict:
    ours = Requests(model, batch, context + 2 * steps + 4)
    tokens = [int(ours.prefill(i, prompt(context, generator))[0].argmax()) for i in range(batch)]
    for _ in range(steps // 2):  # warm
        tokens = ours.forward([(i, [t]) for i, t in enumerate(tokens)]).argmax(-1).tolist()
    with timed_phases() as spent:
        t0 = time.perf_counter()
        for _ in range(steps):
            tokens = ours.forward([(i, [t]) for i, t in enumerate(tokens)]).argmax(-1).tolist()
        total = time.perf_counter() - t0
    per_step = {label: 1e3 * s / steps for label, s in spent.items()}
    per_step["other (head, embedding, slot rows, glue)"] = 1e3 * total / steps - sum(per_step.values())
    return {"batch": batch, "context": context, "step_ms": 1e3 * total / steps, "phases_ms": per_step}


def measure_model(model_dir: Path, args: argparse.Namespace) -> dict:
    model = DeepseekV41ForCausalLM.for_checkpoint(model_dir, torch.float32, page_size=PAGE)
    peer = LlamaPeer(PeerDims.of(model.v41.text))
    generator = torch.Generator().manual_seed(0)
    cases = [Case(1, n) for n in args.contexts] + [Case(b, 512) for b in args.batches if b != 1]
    for _ in range(args.repeats):
        for case in cases:
            run_case(model, peer, case, args.steps, generator)
            print(f"  model B={case.batch} ctx={case.context}: ours {1e3 * case.ours[-1]:.2f} ms, "
                  f"peer {1e3 * case.peer[-1]:.2f} ms", flush=True)  # fmt: skip
    rows = []
    for case in cases:
        ours, peer_s = spread(case.ours), spread(case.peer)
        row = {
            "batch": case.batch,
            "context": case.context,
            "ours_step_ms": {k: 1e3 * v for k, v in ours.items()},
            "peer_step_ms": {k: 1e3 * v for k, v in peer_s.items()},
            "step_vs_peer": ours["median"] / peer_s["median"],
            "ours_tokens_per_s": case.batch / ours["median"],
            "peer_tokens_per_s": case.batch / peer_s["median"],
        }
        if case.batch == 1:
            p_ours, p_peer = spread(case.ours_prefill), spread(case.peer_prefill)
            row["ours_prefill_tokens_per_s"] = case.context / p_ours["median"]
            row["peer_prefill_tokens_per_s"] = case.context / p_peer["median"]
            row["prefill_vs_peer"] = p_peer["median"] / p_ours["median"]
        rows.append(row)
    profiles = [profile_step(model, b, 512, args.steps, generator) for b in (1, max(args.batches))]
    return {"cases": rows, "goals": goals(rows), "profile": profiles}


def goals(rows: list[dict]) -> dict:
    """The issue's goals as ratios of this run's rows, from the medians and from the minima (on a
    shared machine a repeat that other work slowed moves a median; the minima are the quiet
    runs of both sides)."""
    at = {(r["batch"], r["context"]): r for r in rows}
    one = at[1, 512]
    longest = max((r for r in rows if r["batch"] == 1), key=lambda r: r["context"])
    widest = max((r for r in rows if r["context"] == 512), key=lambda r: r["batch"])
    out = {}
    for stat in ("median", "min"):
        step = lambda r, stat=stat: r["ours_step_ms"][stat]  # noqa: E731
        out[stat] = {
            "step_vs_peer_b1_512 (<= 1.5)": step(one) / one["peer_step_ms"][stat],
            f"tokens_per_s_b{widest['batch']}_vs_b1 (>= 8)": widest["batch"] * step(one) / step(widest),
            f"step_{longest['context']}_vs_512 (<= 1.2)": step(longest) / step(one),
        }
    out["prefill_vs_peer_512 (>= 0.5)"] = one["prefill_vs_peer"]
    return out


# --- served -----------------------------------------------------------------------------------


@contextlib.contextmanager
def llama_server(model_dir: Path, flags: list[str], log: Path, timeout_s: float) -> Iterator[str]:
    """Upstream SGLang serving a Llama checkpoint on the CPU engine, with the settings `serve`
    gives ours (`launcher.build_launch`: CPU engine, op shim, torch_native attention, sleep on
    idle); its own model code, float32. Yields the base URL."""
    port = free_port()
    launch = launcher.build_launch(model_dir, ["--port", str(port), "--dtype", "float32", *flags], gpu=False)
    with open(log, "w") as out:
        proc = launcher.start(launch, stdout=out, stderr=out)
    try:
        launcher.wait_ready(launch.url, proc, timeout_s, log)
        yield launch.url
    finally:
        launcher.stop(proc)


def measure_served(url: str, args: argparse.Namespace, generator: torch.Generator) -> dict:
    stream = serve_scaling.stream_generate
    timeout = args.request_timeout
    stream(url, prompt(64, generator), 4, timeout)  # warm-up
    contexts, batches = [], []
    for n in args.contexts:
        steps, ttft = [], []
        for _ in range(args.repeats):
            s = stream(url, prompt(n, generator), args.steps, timeout)
            steps.append(s.step_s())
            ttft.append(s.first_token_s)
        contexts.append(
            {
                "context": n,
                "step_ms": {k: 1e3 * v for k, v in spread(steps).items()},
                "time_to_first_token_s": spread(ttft),
                "prefill_tokens_per_s": n / statistics.median(ttft),
            }
        )
        print(f"  served ctx={n}: {contexts[-1]}", flush=True)
    for b in args.batches:
        steps = [
            serve_scaling.batch_step(url, [prompt(512, generator) for _ in range(b)], args.steps, timeout)[0]
            for _ in range(args.repeats)
        ]
        batches.append(
            {
                "batch": b,
                "step_ms": {k: 1e3 * v for k, v in spread(steps).items()},
                "tokens_per_s": b / statistics.median(steps),
            }
        )
        print(f"  served B={b}: {batches[-1]}", flush=True)
    return {"by_context": contexts, "by_batch": batches}


def served_flags(args: argparse.Namespace) -> list[str]:
    tokens = max(max(args.contexts) + 2 * args.steps, max(args.batches) * (512 + 2 * args.steps))
    return [
        "--max-total-tokens", str(tokens + CHUNK), "--chunked-prefill-size", str(CHUNK),
        "--max-running-requests", str(max(max(args.batches), 8)),
    ]  # fmt: skip


def measure_size(size: str, args: argparse.Namespace) -> dict:
    model_dir = checkpoint(size)
    text = V41Config.from_file(model_dir).text
    result: dict = {"checkpoint": str(model_dir), "dims": _dims(text)}
    print(f"{size}: model step", flush=True)
    result["model"] = measure_model(model_dir, args)
    if args.no_served:
        return result
    env = {"SGLANG_DS41_DTYPE": "float32", "SGLANG_CPU_OMP_THREADS_BIND": launcher.omp_bind(1, args.cpus)}
    os.environ.update(env)  # the Llama server inherits it too
    flags = served_flags(args)
    with tempfile.TemporaryDirectory(prefix="bench-speed-") as tmp:
        print(f"{size}: served, sglang-ds41 serve", flush=True)
        with running_server(model_dir, flags, log_path=Path(tmp) / "ours.log", env=env) as server:
            result["served"] = measure_served(server.url, args, torch.Generator().manual_seed(1))
        if not args.no_sglang_peer:
            print(f"{size}: served, upstream SGLang Llama", flush=True)
            llama = write_hf_llama(
                LlamaPeer(PeerDims.of(text)), Path(tmp) / "llama", TOKENIZER_DIR, text.max_position_embeddings
            )
            with llama_server(llama, flags, Path(tmp) / "llama.log", args.ready_timeout) as url:
                result["served_sglang_llama"] = measure_served(url, args, torch.Generator().manual_seed(1))
    return result


def _dims(t) -> str:
    return (
        f"hidden {t.hidden_size}, {t.num_hidden_layers} layers, "
        f"{t.num_attention_heads} heads x {t.head_dim}, "
        f"window {t.sliding_window}, top-k {t.index_topk}, {t.n_routed_experts} experts x "
        f"{t.moe_intermediate_size} (top {t.num_experts_per_tok} + {t.n_shared_experts} shared), "
        f"vocab {t.vocab_size}"
    )


# --- report -----------------------------------------------------------------------------------


def table(size: str, r: dict) -> str:
    m = r["model"]
    lines = [f"### {size}: {r['dims']}", "", "| batch | context | ours step ms (min / med) | "
             "peer step ms | ours / peer | ours prefill tok/s | peer prefill tok/s |",
             "|---|---|---|---|---|---|---|"]  # fmt: skip
    for c in m["cases"]:
        o, p = c["ours_step_ms"], c["peer_step_ms"]
        pre = (
            f"{c['ours_prefill_tokens_per_s']:.0f} | {c['peer_prefill_tokens_per_s']:.0f}"
            if "prefill_vs_peer" in c
            else " | "
        )
        lines.append(
            f"| {c['batch']} | {c['context']} | {o['min']:.2f} / {o['median']:.2f} "
            f"| {p['min']:.2f} / {p['median']:.2f} | {c['step_vs_peer']:.2f} | {pre} |"
        )
    g = m["goals"]
    for stat in ("median", "min"):
        lines += ["", f"goals ({stat}s): " + ", ".join(f"{k} = {v:.2f}" for k, v in g[stat].items())]
    lines.append(f"prefill_vs_peer_512 (>= 0.5) = {g['prefill_vs_peer_512 (>= 0.5)']:.2f}")
    for prof in m["profile"]:
        parts = sorted(prof["phases_ms"].items(), key=lambda kv: -kv[1])
        lines += [
            "",
            f"where a step goes (batch {prof['batch']}, context {prof['context']}, "
            f"{prof['step_ms']:.2f} ms): " + ", ".join(f"{k} {v:.2f}" for k, v in parts),
        ]
    for key, name in (("served", "sglang-ds41 serve"), ("served_sglang_llama", "upstream SGLang Llama")):
        if key not in r:
            continue
        s = r[key]
        contexts = "; ".join(
            f"ctx {c['context']}: step {c['step_ms']['median']:.1f} ms, TTFT "
            f"{c['time_to_first_token_s']['median']:.2f} s"
            for c in s["by_context"]
        )
        batches = "; ".join(f"B={b['batch']}: {b['tokens_per_s']:.1f} tok/s" for b in s["by_batch"])
        lines += ["", f"served, {name}: {contexts}; {batches}"]
    return "\n".join(lines)


def _ints(text: str) -> tuple[int, ...]:
    return tuple(int(part) for part in text.split(","))


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="tiny,trained,shipped", help="of tiny, trained, shipped")
    parser.add_argument("--contexts", type=_ints, default=(512, 4096, 16384))
    parser.add_argument("--batches", type=_ints, default=(1, 4, 16))
    parser.add_argument("--steps", type=int, default=16, help="decode steps per measurement")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--no-served", action="store_true", help="only the in-process model step")
    parser.add_argument("--no-sglang-peer", action="store_true", help="skip upstream SGLang's Llama")
    parser.add_argument("--request-timeout", type=float, default=1800.0)
    parser.add_argument("--ready-timeout", type=float, default=900.0)
    parser.add_argument("--output", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    args.sizes = args.sizes.split(",")
    if unknown := set(args.sizes) - {"tiny", "trained", "shipped"}:
        parser.error(f"--sizes: unknown {sorted(unknown)}")
    if 512 not in args.contexts or 1 not in args.batches:
        parser.error("--contexts must include 512 and --batches 1 (the goals' base case)")
    args.cpus = sorted(os.sched_getaffinity(0))[:1]
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    torch.set_num_threads(1)
    import sglang

    result = {
        "threads": 1, "dtype": "float32", "torch": torch.__version__, "sglang": sglang.__version__,
        "machine": platform.machine(), "load_average_1m_start": os.getloadavg()[0], "sizes": {},
    }  # fmt: skip
    try:
        for size in args.sizes:
            result["sizes"][size] = measure_size(size, args)
    except Ds41Error as error:
        print(f"benchmarks/serve_speed.py: {error}", file=sys.stderr)
        return 1
    result["load_average_1m_end"] = os.getloadavg()[0]
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(result, indent=2) + "\n")
    for size, r in result["sizes"].items():
        print(table(size, r) + "\n")
    print(f"wrote {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
