"""The CPU op shim: what the CPU build of sgl-kernel would provide, for machines without a GPU.

`install()` puts a stand-in `sgl_kernel` module on the import path (`stub.py`), backed by the
torch ops in `ops.py`. It is installed by our `sitecustomize` only when the server runs with
`SGLANG_USE_CPU_ENGINE=1`, i.e. when `sglang-ds41 serve` chose the CPU settings.
"""

from sglang_ds41.serve.cpu.stub import install

__all__ = ["install"]
