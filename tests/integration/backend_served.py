"""Serving a tiny checkpoint with `sglang-ds41 serve` next to its reference model (float64)."""

from __future__ import annotations

import json
import os
import urllib.request

import openai
import torch

from sglang_ds41.checkpoint.convert import convert
from sglang_ds41.checkpoint.tiny import write_tiny
from sglang_ds41.reference.generate import generate
from sglang_ds41.reference.weights import load_reference
from tests.integration.conftest import _STATS
from tests.integration.server import running_server

STEPS = 20
PROMPTS = [
    [0, 3, 17, 9, 1200, 77, 5, 5, 5, 8, 300, 41, 12, 6, 99, 1000, 4, 2, 19, 23, 64, 7],
    [0, 88, 12345, 2, 7],
    [0, *range(1000, 1041)],  # 42 tokens
]


def server_env(tp: int = 1) -> dict[str, str]:
    # float64 like the oracle; one OpenMP thread per rank (many tiny ops on a shared 2-core box)
    cpus = sorted(os.sched_getaffinity(0))
    bind = "|".join(str(cpus[r % len(cpus)]) for r in range(tp))
    return {"SGLANG_DS41_DTYPE": "float64", "SGLANG_CPU_OMP_THREADS_BIND": bind}


def post_generate(server, ids: list[int], steps: int, images: list[str] | None = None) -> dict:
    """Greedy `steps` new tokens for prompt `ids` from SGLang's native `/generate`."""
    body: dict = {
        "input_ids": ids,
        "sampling_params": {"max_new_tokens": steps, "temperature": 0, "ignore_eos": True},
    }
    if images is not None:
        body["image_data"] = images
    request = urllib.request.Request(
        server.url + "/generate", json.dumps(body).encode(), {"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=300) as reply:
        return json.loads(reply.read())


class Served:
    """A running server plus the reference model of the checkpoint it serves."""

    def __init__(self, server, reference):
        self.server, self.reference = server, reference
        self.client = openai.OpenAI(base_url=server.openai_url, api_key="unused", timeout=300, max_retries=0)

    def generate(self, ids: list[int], steps: int = STEPS) -> dict:
        return post_generate(self.server, ids, steps)

    def expected(self, ids: list[int], steps: int = STEPS) -> list[int]:
        return generate(self.reference, ids, steps)


def serve_tiny(
    tmp_path_factory,
    variant: str,
    engram: str,
    args: list[str],
    tp: int = 1,
    ready_s: float = 300,
    converted: bool = False,
):
    """`converted`: the MXFP4 Engram checkpoint is made by `convert-engram` from the FP8 one."""
    root = tmp_path_factory.mktemp(f"backend-{variant}-{engram}")
    if converted:
        fp8 = write_tiny(root / "fp8", variant, "fp8", seed=0)
        convert(fp8, root / "checkpoint", engram, log=lambda _: None)
        model_dir = root / "checkpoint"
    else:
        model_dir = write_tiny(root / "checkpoint", variant, engram, seed=0)
    reference = load_reference(model_dir, torch.float64)
    with running_server(
        model_dir, args, log_path=root / "server.log", env=server_env(tp), ready_timeout_s=ready_s
    ) as server:
        yield Served(server, reference)
    _STATS.append(
        f"V4.1 backend {variant}/{engram} {' '.join(args)}: ready after {server.ready_s:.1f} s, "
        f"peak RSS of its process tree {server.peak_rss_gib:.2f} GiB, log {server.log_path}"
    )
    assert server.stopped_cleanly, f"serve did not stop cleanly; log {server.log_path}"
