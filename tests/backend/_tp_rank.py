"""One TP rank of the backend outside a server (run as a script by test_tp.py).

Joins a gloo group through MASTER_ADDR / MASTER_PORT, builds its shard of the tiny checkpoint,
runs a fixed batch (two requests prefilled together, one of them chunked, then greedy decode
steps of both) and saves the logits of every step, which every rank must agree on.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).parent))

from _slots import Slots, run

from sglang_ds41.backend.model import DeepseekV41ForCausalLM
from sglang_ds41.backend.tp import TensorParallel

PROMPTS = {1: [0, 3, 17, 9, 1200, 77, 5, 5, 5, 8, 300, 41, 12], 2: [0, 64, 7, 7, 99, 1000, 4, 2, 19]}
DECODE_STEPS = 6


def logits_of_the_script(backend: DeepseekV41ForCausalLM) -> list[torch.Tensor]:
    """Each forward's logits [requests, vocab]: a batched prefill with request 2 cut after 4
    tokens, the rest of request 2, then greedy decode steps of both requests together."""
    slots = Slots(backend.v41.text)
    first = run(backend, slots, [(1, PROMPTS[1]), (2, PROMPTS[2][:4])])
    rest = run(backend, slots, [(2, PROMPTS[2][4:])])
    out = [first, rest]
    last = torch.stack([first[0], rest[0]])
    for _ in range(DECODE_STEPS):
        nxt = last.argmax(-1).tolist()
        last = run(backend, slots, [(1, nxt[:1]), (2, nxt[1:])])
        out.append(last)
    return out


def main(ckpt: str, rank: int, size: int, out: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=size)
    try:
        backend = DeepseekV41ForCausalLM.for_checkpoint(ckpt, torch.float64, tp=TensorParallel(rank, size))
        torch.save(logits_of_the_script(backend), out)
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4])
