"""The stand-in `sgl_kernel` module, in a fresh interpreter (it changes the import system)."""

import subprocess
import sys

PROBE = """
import os
os.environ["SGLANG_USE_CPU_ENGINE"] = "1"
from sglang_ds41.serve.launch_hooks import install
install()
import sgl_kernel
from sgl_kernel import assign_req_to_token_pool_cpu, copy_all_layer_kv_cache_cpu
from sglang_ds41.serve.cpu import ops
assert assign_req_to_token_pool_cpu is ops.assign_req_to_token_pool_cpu
assert copy_all_layer_kv_cache_cpu is ops.copy_all_layer_kv_cache_cpu
try:
    from sgl_kernel import fused_experts_cpu
except ImportError:
    pass
else:
    raise AssertionError("ops the shim does not provide must be missing")
from sgl_kernel import rotate_input_ids_cpu
try:
    rotate_input_ids_cpu()
except NotImplementedError as error:
    assert "speculative decoding" in str(error)
else:
    raise AssertionError("speculative ops must refuse to run")
print("ok", sgl_kernel.__version__)
"""


def test_cpu_engine_gets_the_stand_in_sgl_kernel():
    done = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("ok 0.0.0+sglang-ds41-cpu-shim")


def test_without_the_cpu_engine_no_stand_in_is_installed():
    probe = (
        "import os; os.environ.pop('SGLANG_USE_CPU_ENGINE', None)\n"
        "from sglang_ds41.serve.launch_hooks import install; install()\n"
        "import importlib.util; spec = importlib.util.find_spec('sgl_kernel')\n"
        "print(spec and spec.origin)"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() != "sglang-ds41-cpu-shim"
