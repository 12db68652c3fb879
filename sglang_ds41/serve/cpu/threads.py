"""What the CPU build of sgl-kernel's `init_cpu_threads_env` does for a TP rank, without it.

SGLang gives each rank its cores (`SGLANG_CPU_OMP_THREADS_BIND`, "0-3|4-7", or one NUMA node
each) and binds the rank's OpenMP threads to them, but only through sgl-kernel's AMX / arm64
build; elsewhere it logs a warning and binds nothing, so every rank runs torch's default
thread count on every core. On a small machine the ranks and the tokenizer, detokenizer and
HTTP processes then share cores with spinning OpenMP threads, and a decode step of tiny ops
took 4-5x its in-process time (the tiny model: ~1.4 s instead of ~30 ms with two threads on a
loaded 2-core box). `bind` restores the documented effect: the rank runs on its cores, with
one torch thread per core.
"""

from __future__ import annotations

import os


def parse_cpus(spec: str) -> list[int]:
    """SGLang's core list of one rank, "0-3,8,10-11" -> [0, 1, 2, 3, 8, 10, 11]."""
    cpus: list[int] = []
    for part in filter(None, (p.strip() for p in spec.split(","))):
        first, _, last = part.partition("-")
        cpus.extend(range(int(first), int(last or first) + 1))
    return sorted(set(cpus))


def bind(local_omp_cpuid: str | None) -> None:
    """Pin this process to the rank's cores and give torch one thread per core."""
    import torch

    if not local_omp_cpuid:
        return
    cpus = [c for c in parse_cpus(local_omp_cpuid) if c in os.sched_getaffinity(0)] or sorted(
        os.sched_getaffinity(0)
    )
    os.sched_setaffinity(0, cpus)
    torch.set_num_threads(len(cpus))
