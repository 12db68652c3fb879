"""The real-server harness of the integration tests; it lives in the package so that
`benchmarks/serve.py` measures servers the same way (`sglang_ds41.serve.server_process`)."""

from sglang_ds41.serve.server_process import READY_TIMEOUT_S, Server, free_port, running_server

__all__ = ["READY_TIMEOUT_S", "Server", "free_port", "running_server"]
