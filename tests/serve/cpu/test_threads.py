"""Each CPU rank bound to its cores with one torch thread per core, as SGLang does only with
sgl-kernel's AMX / arm64 build; and decode-sized forwards on one thread."""

import os
import subprocess
import sys

import pytest
import torch

from sglang_ds41.backend.model import SMALL_FORWARD_TOKENS, one_thread_for_small
from sglang_ds41.serve.cpu.threads import parse_cpus

# SGLang's own bootstrap calls its `_init_cpu_threads_env` with the rank's core list; the hook
# must turn that into the binding, in a server process (a fresh interpreter here).
PROBE = """
import os, sys
os.environ["SGLANG_USE_CPU_ENGINE"] = "1"
from sglang_ds41.serve.launch_hooks import install
install()
import torch
from sglang.srt.distributed import bootstrap
assert not (bootstrap._is_cpu_amx_available or bootstrap._is_cpu_arm64), "an AMX machine binds itself"
cpu = sorted(os.sched_getaffinity(0))[-1]
torch.set_num_threads(4)
bootstrap._init_cpu_threads_env(local_omp_cpuid=str(cpu), dist_init_method=None)
assert sorted(os.sched_getaffinity(0)) == [cpu], os.sched_getaffinity(0)
assert torch.get_num_threads() == 1, torch.get_num_threads()
print("bound", cpu)
"""


def test_sglang_s_rank_binding_pins_the_rank_and_sets_its_threads():
    out = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.strip().startswith("bound")


def test_core_lists_in_sglang_s_format():
    assert parse_cpus("0") == [0]
    assert parse_cpus("0-3,8,10-11") == [0, 1, 2, 3, 8, 10, 11]
    assert parse_cpus("2,1,1") == [1, 2]


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two cores to see a change")
def test_small_forwards_run_on_one_thread_and_restore_the_count():
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        with one_thread_for_small(SMALL_FORWARD_TOKENS):
            assert torch.get_num_threads() == 1
        assert torch.get_num_threads() == 2
        with one_thread_for_small(SMALL_FORWARD_TOKENS + 1):  # a prefill keeps the rank's threads
            assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)
