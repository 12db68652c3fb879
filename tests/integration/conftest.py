"""Session fixtures: real servers, started once per test session and always stopped."""

from __future__ import annotations

import pytest
import torch

from sglang_ds41.checkpoint.scripted import write_scripted_checkpoint
from tests.integration.server import Server, running_server

_STATS: list[str] = []


@pytest.fixture(scope="module")
def one_torch_thread_per_module():
    """`one_torch_thread` for a whole module, so that it also covers module-scoped server
    fixtures and their reference models (tiny ops: one thread on the shared box)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="session")
def scripted_server(tmp_path_factory) -> Server:
    """`sglang-ds41 serve` on the scripted checkpoint (CPU settings when there is no GPU)."""
    root = tmp_path_factory.mktemp("scripted-server")
    model_dir = write_scripted_checkpoint(root / "checkpoint")
    with running_server(model_dir, log_path=root / "server.log") as server:
        yield server
    _STATS.append(
        f"scripted server: ready after {server.ready_s:.1f} s, peak RSS of its process tree "
        f"{server.peak_rss_gib:.2f} GiB, log {server.log_path}"
    )
    assert server.stopped_cleanly, f"serve did not stop its server cleanly on SIGTERM; log {server.log_path}"


@pytest.fixture(scope="session")
def scripted_budget_server(tmp_path_factory) -> Server:
    """The scripted model served as `default` with a server thinking token budget of 64
    (`serve --served-model-name default --thinking-token-budget 64`)."""
    root = tmp_path_factory.mktemp("scripted-budget-server")
    model_dir = write_scripted_checkpoint(root / "checkpoint")
    args = ["--served-model-name", "default", "--thinking-token-budget", "64"]
    with running_server(model_dir, args, log_path=root / "server.log") as server:
        yield server
    _STATS.append(f"scripted server (default, budget 64): ready after {server.ready_s:.1f} s, log {root}")
    assert server.stopped_cleanly, f"serve did not stop its server cleanly on SIGTERM; log {server.log_path}"


def pytest_terminal_summary(terminalreporter) -> None:
    for line in _STATS:
        terminalreporter.write_line(line)
