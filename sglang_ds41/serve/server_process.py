"""A real SGLang server as a measured child process, started through `sglang-ds41 serve`.

Shared by the integration tests and `benchmarks/serve.py`, which both need the same things
of a server: a free 127.0.0.1 port, the time from launch to ready, the peak memory of the
whole process tree (SGLang forks a scheduler and a detokenizer per rank), and a teardown that
never leaves a process behind.

`running_server(model_dir, args, log_path)` starts `python -m sglang_ds41 serve` in its own
session, waits until `/health_generate` answers (or the server dies, or the timeout passes:
the error carries the log tail), samples the summed RSS of the process tree, and always tears
everything down: SIGTERM to `serve` (which stops SGLang's process group), then SIGKILL to
whatever of the tree is left. Needs psutil (the `serve` extra).
"""

from __future__ import annotations

import contextlib
import os
import random
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import psutil

from sglang_ds41.errors import Ds41Error
from sglang_ds41.serve.launcher import BIND_FAILED, read_tail

READY_TIMEOUT_S = 300.0


class ServerError(Ds41Error, RuntimeError):
    """The server died or did not become ready; the message carries its log tail."""


PORT_RANGE = (30000, 32767)  # above SGLang's rendezvous ports (22000-29999), below ephemeral


def free_port() -> int:
    """A free port outside the kernel's ephemeral range.

    The server binds its HTTP port only after loading the model; an ephemeral port would be
    free until then for anything binding port 0 (the TP ranks' gloo sockets took one once,
    and the HTTP server then failed with "address already in use")."""
    for port in random.sample(range(PORT_RANGE[0], PORT_RANGE[1] + 1), 64):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class _MemorySampler(threading.Thread):
    """Peak summed RSS of a process and all its descendants."""

    def __init__(self, pid: int, every_s: float = 0.5) -> None:
        super().__init__(daemon=True)
        self.pid, self.every_s = pid, every_s
        self.peak_bytes = 0
        self.done = threading.Event()

    def tree(self) -> list[psutil.Process]:
        try:
            root = psutil.Process(self.pid)
            return [root, *root.children(recursive=True)]
        except psutil.NoSuchProcess:
            return []

    def run(self) -> None:
        while not self.done.is_set():
            total = 0
            for proc in self.tree():
                with contextlib.suppress(psutil.NoSuchProcess, psutil.AccessDenied):
                    total += proc.memory_info().rss
            self.peak_bytes = max(self.peak_bytes, total)
            self.done.wait(self.every_s)


@dataclass
class Server:
    """A started server: its base URL, log file, and measurements."""

    url: str
    port: int
    log_path: Path
    proc: subprocess.Popen
    sampler: _MemorySampler
    started_at: float = field(default_factory=time.monotonic)
    ready_s: float | None = None
    stopped_cleanly: bool | None = None  # serve exited 0 on SIGTERM and took every child with it

    @property
    def openai_url(self) -> str:
        return self.url + "/v1"

    @property
    def peak_rss_gib(self) -> float:
        return self.sampler.peak_bytes / 2**30

    def log_tail(self, lines: int = 60) -> str:
        text = read_tail(self.log_path)  # bounded: the wait loop asks twice a second
        return "\n".join(text.splitlines()[-lines:]) if text else "(no log)"

    def wait_ready(self, timeout_s: float) -> None:
        while time.monotonic() - self.started_at < timeout_s:
            if self.proc.poll() is not None:
                raise ServerError(
                    f"server exited with code {self.proc.returncode} before it was ready; "
                    f"log {self.log_path}:\n{self.log_tail()}"
                )
            if BIND_FAILED in self.log_tail(5):  # SGLang's HTTP server gave up; its processes live on
                raise ServerError(
                    f"server could not bind port {self.port}; log {self.log_path}:\n{self.log_tail()}"
                )
            with (
                contextlib.suppress(urllib.error.URLError, OSError),
                urllib.request.urlopen(self.url + "/health_generate", timeout=10) as reply,
            ):
                if reply.status == 200:
                    self.ready_s = time.monotonic() - self.started_at
                    return
            time.sleep(0.5)
        raise ServerError(
            f"server not ready after {timeout_s:.0f} s; log {self.log_path}:\n{self.log_tail()}"
        )

    def stop(self, grace_s: float = 30.0) -> None:
        family = self.sampler.tree()  # remembered now: children are reparented once serve exits
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.proc.pid, signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(grace_s)
        _, alive = psutil.wait_procs(family, timeout=5)
        self.stopped_cleanly = self.proc.returncode == 0 and not alive
        for proc in family:
            with contextlib.suppress(psutil.NoSuchProcess):
                proc.kill()
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(10)
        self.sampler.done.set()


@contextlib.contextmanager
def running_server(
    model_dir: str | Path,
    args: Sequence[str] = (),
    *,
    log_path: str | Path,
    ready_timeout_s: float = READY_TIMEOUT_S,
    env: dict[str, str] | None = None,
) -> Iterator[Server]:
    """Serve `model_dir` with `sglang-ds41 serve MODEL_DIR --port P [args]` until the block ends."""
    port = free_port()
    log_path = Path(log_path)
    # --verbose: SGLang's own output into this log too (the error tails and bind check read it)
    argv = [sys.executable, "-m", "sglang_ds41", "serve", str(model_dir), "--verbose", "--port", str(port)]
    argv += args
    with open(log_path, "w") as log:
        proc = subprocess.Popen(
            argv,
            stdout=log,
            stderr=subprocess.STDOUT,
            env={**os.environ, **(env or {})},
            start_new_session=True,
        )
    sampler = _MemorySampler(proc.pid)
    sampler.start()
    server = Server(url=f"http://127.0.0.1:{port}", port=port, log_path=log_path, proc=proc, sampler=sampler)
    try:
        server.wait_ready(ready_timeout_s)
        yield server
    finally:
        server.stop()
