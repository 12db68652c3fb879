"""How the CPU server's decode step and prefill memory scale, through a real server (`serve.py`).

Measured on one server of the tiny model with a longer context (`long_context_checkpoint`):

* decode step vs context length: one request at a time with a P-token prompt (P in --contexts,
  default 512, 4k, 16k, 64k) streamed from `/generate`; the decode step is the median time
  between streamed tokens after the first, the prefill time the time to the first token;
* the peak RSS of each prefill: the summed RSS of the server's process tree sampled during the
  request, minus what it was right before (its growth, next to the state the prompt adds);
* decode step vs batch: B concurrent requests (B in --batches, default 1, 8, 32) of a 512-token
  prompt each; once every request has its first token, the step is the wall time of the decode
  steps all of them run together, and tokens/s = B / step.

Times are wall-clock, so other work on the cores shows in them: each row carries the 1-minute
load average when it ended.

The served tiny checkpoint has 8,192 positions (tests use it as it is). This benchmark writes a
variant beside it that differs only in `max_position_embeddings` (131,072): the same tensors
(linked), so the same model; its RoPE / YaRN numbers do not depend on that field.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import statistics
import threading
import time
import urllib.request
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import psutil

from sglang_ds41.errors import Ds41Error

LONG_CONTEXT = 131072  # max_position_embeddings of the benchmark's checkpoint
CONTEXTS = (512, 4096, 16384, 65536)
BATCHES = (1, 8, 32)


def long_context_checkpoint(tiny_dir: Path) -> Path:
    """`tiny_dir` with `max_position_embeddings` = LONG_CONTEXT: a sibling directory whose files
    are links to the tiny checkpoint's, except its own config.json (written once)."""
    target = tiny_dir.with_name(tiny_dir.name + f"-ctx{LONG_CONTEXT}")
    config = target / "config.json"
    if config.is_file():
        return target
    target.mkdir(exist_ok=True)
    for f in tiny_dir.iterdir():
        if f.name != "config.json" and not (target / f.name).exists():
            os.symlink(f.resolve(), target / f.name)
    data = json.loads((tiny_dir / "config.json").read_text())
    data["text_config"]["max_position_embeddings"] = LONG_CONTEXT
    partial = target / "config.json.partial"
    partial.write_text(json.dumps(data, indent=2) + "\n")
    partial.rename(config)
    return target


@dataclass
class Stream:
    """One streamed request: when it was sent and when each streamed chunk's token count arrived."""

    sent: float
    arrivals: list[tuple[float, int]]  # (seconds since epoch of perf_counter, completion tokens)

    @property
    def first_token_s(self) -> float:
        return self.arrivals[0][0] - self.sent

    def step_s(self) -> float:
        """Median seconds per decode token after the first token."""
        gaps = [(t1 - t0) / (n1 - n0) for (t0, n0), (t1, n1) in itertools.pairwise(self.arrivals) if n1 > n0]
        if not gaps:
            raise Ds41Error("the stream carried fewer than two tokens")
        return statistics.median(gaps)


def stream_generate(url: str, ids: list[int], steps: int, timeout_s: float) -> Stream:
    """Greedy `steps` tokens for `ids` from `/generate` with `stream: true`."""
    sampling = {"max_new_tokens": steps, "temperature": 0, "ignore_eos": True}
    body = {"input_ids": ids, "sampling_params": sampling, "stream": True}
    request = urllib.request.Request(
        url + "/generate", json.dumps(body).encode(), {"Content-Type": "application/json"}
    )
    sent, arrivals = time.perf_counter(), []
    with urllib.request.urlopen(request, timeout=timeout_s) as reply:
        for raw in reply:
            line = raw.decode().strip()
            if not line.startswith("data:") or line == "data: [DONE]":
                continue
            out = json.loads(line[len("data:") :])
            if "error" in out:
                raise Ds41Error(f"/generate: {out['error']}")
            arrivals.append((time.perf_counter(), int(out["meta_info"]["completion_tokens"])))
    if not arrivals or arrivals[-1][1] != steps:
        got = arrivals[-1][1] if arrivals else 0
        raise Ds41Error(f"/generate streamed {got} tokens, expected {steps}")
    return Stream(sent, arrivals)


class TreeRss:
    """Samples the summed RSS of a process tree while a `during()` block runs."""

    def __init__(self, pid: int, every_s: float = 0.05) -> None:
        self.pid, self.every_s = pid, every_s

    def now(self) -> int:
        try:
            root = psutil.Process(self.pid)
            procs = [root, *root.children(recursive=True)]
        except psutil.NoSuchProcess:
            return 0
        total = 0
        for proc in procs:
            with contextlib.suppress(psutil.NoSuchProcess, psutil.AccessDenied):
                total += proc.memory_info().rss
        return total

    def during(self, work: Callable[[], object]) -> tuple[object, int, int]:
        """(work's result, RSS before, peak RSS while it ran) in bytes."""
        before, peak, done = self.now(), [0], threading.Event()

        def sample() -> None:
            while not done.wait(self.every_s):
                peak[0] = max(peak[0], self.now())

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        try:
            result = work()
        finally:
            done.set()
            sampler.join()
        return result, before, max(peak[0], before, self.now())


def by_context(
    url: str, rss: TreeRss, make_prompt: Callable[[int], list[int]], contexts: Sequence[int],
    steps: int, timeout_s: float, state_bytes_per_token: float,
) -> list[dict]:  # fmt: skip
    rows = []
    for n in contexts:
        stream, before, peak = rss.during(lambda n=n: stream_generate(url, make_prompt(n), steps, timeout_s))
        rows.append(
            {
                "context_tokens": n,
                "decode_step_ms": 1e3 * stream.step_s(),
                "prefill_s": stream.first_token_s,
                "prefill_tokens_per_s": n / stream.first_token_s,
                "rss_before_gib": before / 2**30,
                "prefill_peak_rss_gib": peak / 2**30,
                "prefill_rss_growth_mib": (peak - before) / 2**20,
                "state_of_the_prompt_mib": n * state_bytes_per_token / 2**20,
                "load_average_1m": os.getloadavg()[0],
            }
        )
        print(f"  context {n}: {rows[-1]}", flush=True)
    return rows


def by_batch(
    url: str, make_prompt: Callable[[int], list[int]], batches: Sequence[int], prompt: int, steps: int,
    timeout_s: float,
) -> list[dict]:  # fmt: skip
    rows = []
    for b in batches:
        step, shared = batch_step(url, [make_prompt(prompt) for _ in range(b)], steps, timeout_s)
        rows.append(
            {
                "batch": b,
                "prompt_tokens": prompt,
                "decode_steps_together": shared,
                "decode_step_ms": 1e3 * step,
                "decode_tokens_per_s": b / step,
                "load_average_1m": os.getloadavg()[0],
            }
        )
        print(f"  batch {b}: {rows[-1]}", flush=True)
    one = next((r["decode_tokens_per_s"] for r in rows if r["batch"] == 1), None)
    for row in rows:
        row["tokens_per_s_vs_batch_1"] = row["decode_tokens_per_s"] / one if one else None
    return rows


def batch_step(url: str, prompts: list[list[int]], steps: int, timeout_s: float) -> tuple[float, float]:
    """All `prompts` streamed at once -> (seconds per decode step they ran together, how many
    such steps): from the last first token to the first end, the tokens each got meanwhile."""
    with ThreadPoolExecutor(len(prompts)) as pool:
        streams = list(pool.map(lambda ids: stream_generate(url, ids, steps, timeout_s), prompts))
    start = max(s.arrivals[0][0] for s in streams)
    end = min(s.arrivals[-1][0] for s in streams)
    shared = statistics.median(_tokens_between(s, start, end) for s in streams)
    if shared < 2:
        raise Ds41Error(f"batch {len(prompts)}: its requests decoded together for {shared} steps only")
    return (end - start) / shared, shared


def _tokens_between(stream: Stream, start: float, end: float) -> int:
    """Tokens the stream received in (start, end]."""
    at_start = max((n for t, n in stream.arrivals if t <= start), default=0)
    at_end = max((n for t, n in stream.arrivals if t <= end), default=0)
    return at_end - at_start
