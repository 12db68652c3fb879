"""Launch `python -m sglang.launch_server` for a V4.1 checkpoint with the flags it needs.

Our defaults come first and every flag the user gives replaces ours (same flag, any value
form); anything else passes through to SGLang untouched. Two engines:

* on a GPU, upstream SGLang's own V4.1 model: a plain launch_server with the V4.1 parsers;
  our SGLang plugin (entry point `sglang.srt.plugins`) gives it the MXFP4 Engram tables;
* on the CPU (no GPU, or `--device cpu`), our own backend: the environment registers our
  models (`SGLANG_EXTERNAL_MODEL_PACKAGE`) and puts `_pythonpath/` (our `sitecustomize`, the
  launch hooks) on PYTHONPATH of every server process, and the settings SGLang 0.5.23 needs
  on a CPU-only machine are added: the CPU engine, the torch_native attention backend, a
  bounded KV pool, the op shim, and for `--tp N` the per-rank core binding and PyNccl
  switched off (gloo does the collectives). Flags that would lose its state are refused.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from sglang_ds41.backend import EXTERNAL_MODEL_PACKAGE
from sglang_ds41.errors import Ds41Error

PYTHONPATH_DIR = Path(__file__).parent / "_pythonpath"

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 30000
CPU_MAX_TOTAL_TOKENS = 16384

# Flags that name the same SGLang option (first spelling is the canonical one).
ALIASES = {"--tp": "--tp-size", "--tensor-parallel-size": "--tp-size", "--model": "--model-path"}


@dataclass(frozen=True)
class Launch:
    """What to run: the command line, the environment additions, and where it will listen."""

    argv: list[str]
    env: dict[str, str] = field(default_factory=dict)
    host: str = DEFAULT_HOST
    port: int = DEFAULT_PORT
    cpu: bool = False

    @property
    def url(self) -> str:
        host = "127.0.0.1" if self.host in ("0.0.0.0", "::", "") else self.host
        return f"http://{host}:{self.port}"


def _canonical(flag: str) -> str:
    return ALIASES.get(flag, flag)


def split_flags(args: Sequence[str]) -> list[list[str]]:
    """Group an argument list into [flag, values...] items (a bare value joins the flag before it)."""
    items: list[list[str]] = []
    for arg in args:
        if arg.startswith("--"):
            flag, eq, value = arg.partition("=")
            items.append([_canonical(flag)] + ([value] if eq else []))
        elif items:
            items[-1].append(arg)
        else:
            raise Ds41Error(f"expected an sglang flag (--name ...), got {arg!r}")
    return items


def flag_value(items: Sequence[Sequence[str]], flag: str) -> str | None:
    """The last value given for `flag`, or None when it is absent."""
    values = [item[1] for item in items if item[0] == flag and len(item) > 1]
    return values[-1] if values else None


def merge_flags(defaults: Sequence[Sequence[str]], user: Sequence[Sequence[str]]) -> list[str]:
    """Our defaults minus those the user overrides, then the user's flags in their order."""
    given = {item[0] for item in user}
    out = [arg for item in defaults if item[0] not in given for arg in item]
    return out + [arg for item in user for arg in item]


def has_gpu() -> bool:
    import torch

    return torch.cuda.is_available()


def omp_bind(ranks: int, cpus: Sequence[int]) -> str:
    """SGLANG_CPU_OMP_THREADS_BIND: the usable cores split into `ranks` groups ("0|1");
    with fewer cores than ranks, ranks share cores."""
    cpus = sorted(cpus)
    if ranks <= len(cpus):
        size = len(cpus) // ranks
        groups = [cpus[r * size : (r + 1) * size] for r in range(ranks)]
    else:
        groups = [[cpus[r % len(cpus)]] for r in range(ranks)]
    return "|".join(",".join(map(str, g)) for g in groups)


def tokenizer_dir(model_dir: Path) -> Path | None:
    """Where the tokenizer comes from: the checkpoint's own, else the packaged V4.1 one."""
    if (model_dir / "tokenizer.json").is_file():
        return None
    from sglang_ds41.assets import TOKENIZER_DIR

    return TOKENIZER_DIR


# SGLang features this backend cannot serve V4.1 with, and why; such a flag passes only with
# one of the harmless values listed beside it.
_KEPT_BESIDE = "not the state V4.1 keeps beside them (layer 0's window rows, the ratio-2 pending rows)"
UNSUPPORTED: dict[str, tuple[tuple[str | None, ...], str]] = {
    "--kv-cache-dtype": (
        ("auto",),
        "V4.1 keeps its attention state in its own formats (FP8 window, FP4 latents and index "
        "keys, packed into SGLang's pool rows); leave it at auto",
    ),
    "--enable-hierarchical-cache": ((), f"HiCache moves SGLang's K/V buffers to host, {_KEPT_BESIDE}"),
    "--enable-lmcache": ((), f"LMCache moves SGLang's K/V buffers, {_KEPT_BESIDE}"),
    "--disaggregation-mode": (("null",), f"the prefill->decode hand-over moves K/V buffers, {_KEPT_BESIDE}"),
    "--speculative-algorithm": ((), "this backend has no draft model (DSpark) yet"),
}


def refuse_unsupported(user: Sequence[Sequence[str]]) -> None:
    """Fail before launch, naming the flag, rather than serve state SGLang would lose or misread."""
    for item in user:
        allowed, why = UNSUPPORTED.get(item[0], (None, None))
        if why is not None and (item[1] if len(item) > 1 else None) not in allowed:
            raise Ds41Error(
                f"{' '.join(item)}: not supported for V4.1 by the CPU backend: {why} "
                "(on a GPU, serve upstream SGLang's V4.1 model: --device cuda)"
            )


def build_launch(
    model_dir: str | Path,
    sglang_args: Sequence[str] = (),
    *,
    gpu: bool | None = None,
    python: str = sys.executable,
    cpus: Sequence[int] | None = None,
) -> Launch:
    """The server command and environment for `model_dir`; `gpu=None` asks torch.

    The engine follows the device: on a GPU upstream SGLang's own V4.1 model (our plugin adds
    the MXFP4 Engram tables; SGLang loads it through its entry point), on the CPU (no GPU, or
    `--device cpu`) our own backend with the CPU settings.
    """
    model = Path(model_dir)
    if not (model / "config.json").is_file():
        raise Ds41Error(f"{model} is not a checkpoint directory (no config.json)")
    user = split_flags(sglang_args)
    if flag_value(user, "--model-path") is not None:
        raise Ds41Error("give the checkpoint as MODEL_DIR, not as --model-path")
    device = flag_value(user, "--device")
    cpu = device == "cpu" or (device is None and not (has_gpu() if gpu is None else gpu))

    defaults: list[list[str]] = [
        ["--model-path", str(model)],
        ["--host", DEFAULT_HOST],
        ["--port", str(DEFAULT_PORT)],
        ["--reasoning-parser", "deepseek-v41"],
        ["--tool-call-parser", "deepseekv41"],
    ]
    if (tok := tokenizer_dir(model)) is not None:
        defaults.append(["--tokenizer-path", str(tok)])
    # DeepSeek's API (and deepseek-recipe) think unless told not to; SGLang's default is off.
    env = {"SGLANG_DEFAULT_THINKING": os.environ.get("SGLANG_DEFAULT_THINKING", "1")}
    if cpu:
        refuse_unsupported(user)
        defaults, own_env = _own_backend(defaults, user, cpus)
        env.update(own_env)
    argv = [python, "-m", "sglang.launch_server", *merge_flags(defaults, user)]
    merged = split_flags(argv[3:])
    return Launch(
        argv=argv,
        env=env,
        host=flag_value(merged, "--host") or DEFAULT_HOST,
        port=int(flag_value(merged, "--port") or DEFAULT_PORT),
        cpu=cpu,
    )


def _own_backend(
    defaults: list[list[str]], user: Sequence[Sequence[str]], cpus: Sequence[int] | None
) -> tuple[list[list[str]], dict[str, str]]:
    """Flags and environment of our CPU engine: our model package, its launch hooks, CPU settings."""
    defaults = [
        *defaults,
        # Ratio-2 layers keep one compressed entry per token pair at slot // 2 (backend/kv_state.py).
        ["--page-size", "2"],
        # Image patches from SGLang's PIL path, bit for bit ours (MODEL.md §7.1); its Rust resizer
        # ("auto") can differ by one grey level on strong downscales.
        ["--image-processor-backend", "pil"],
        ["--device", "cpu"],
        ["--attention-backend", "torch_native"],
        ["--max-total-tokens", str(CPU_MAX_TOTAL_TOKENS)],
        ["--mem-fraction-static", "0.3"],
    ]
    pythonpath = os.pathsep.join(p for p in (str(PYTHONPATH_DIR), os.environ.get("PYTHONPATH")) if p)
    env = {
        "PYTHONPATH": pythonpath,
        "SGLANG_EXTERNAL_MODEL_PACKAGE": EXTERNAL_MODEL_PACKAGE,
        "SGLANG_USE_CPU_ENGINE": "1",
        # The nccl wheel that comes with CUDA torch would enable PyNccl, which needs a GPU.
        "SGLANG_NCCL_SO_PATH": "/nonexistent/libnccl.so.2",
    }
    tp_text = flag_value(user, "--tp-size") or "1"
    if not tp_text.isdigit() or int(tp_text) < 1:
        raise Ds41Error(f"--tp must be a positive integer, got {tp_text!r}")
    tp = int(tp_text)
    if tp > 1 and "SGLANG_CPU_OMP_THREADS_BIND" not in os.environ:
        env["SGLANG_CPU_OMP_THREADS_BIND"] = omp_bind(tp, cpus or sorted(os.sched_getaffinity(0)))
    return defaults, env


def describe(launch: Launch) -> str:
    """The exact command and environment of `launch`, as a shell line (`serve --dry-run`)."""
    engine = (
        "sglang-ds41's own backend (CPU engine)"
        if launch.cpu
        else "upstream SGLang's V4.1 model + the sglang-ds41 plugin (MXFP4/NVFP4 Engram tables)"
    )
    env = " ".join(f"{k}={shlex.quote(v)}" for k, v in sorted(launch.env.items()))
    command = " ".join(shlex.quote(a) for a in launch.argv)
    return f"# engine: {engine}\n# listens on {launch.url}\n{env} \\\n  {command}"


def wait_ready(url: str, proc: subprocess.Popen, timeout_s: float) -> float:
    """Seconds until GET /health_generate answers 200; raises if the server dies or times out."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout_s:
        if proc.poll() is not None:
            raise Ds41Error(
                f"the server exited with code {proc.returncode} before it was ready "
                "(its log above says why)"
            )
        try:
            with urllib.request.urlopen(url + "/health_generate", timeout=10) as reply:
                if reply.status == 200:
                    return time.monotonic() - t0
        except (urllib.error.URLError, OSError):
            pass
        time.sleep(0.5)
    raise Ds41Error(f"the server at {url} was not ready after {timeout_s:.0f} s")


def _die_with_parent() -> None:
    """In the child: get SIGTERM if `serve` itself dies, so no server outlives it (Linux)."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except OSError:
        pass


def start(launch: Launch, **popen_kwargs) -> subprocess.Popen:
    """Start the server in its own process group (so that stopping it reaches every child)."""
    return subprocess.Popen(
        launch.argv,
        env={**os.environ, **launch.env},
        process_group=0,
        preexec_fn=_die_with_parent,
        **popen_kwargs,
    )


def stop(proc: subprocess.Popen, grace_s: float = 30.0) -> int:
    """SIGTERM to the server's process group, SIGKILL after `grace_s`; returns its exit code."""
    for sig, wait_s in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 10.0)):
        if proc.poll() is not None:
            break
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            break
        try:
            proc.wait(wait_s)
        except subprocess.TimeoutExpired:
            continue
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)  # children left in the group after the leader exited
    return proc.wait()


def serve(launch: Launch, ready_timeout_s: float = 600.0) -> int:
    """Run the server in the foreground until it exits or we get SIGINT/SIGTERM."""
    proc = start(launch)
    stopping = False

    def on_signal(signum, frame):
        nonlocal stopping
        stopping = True
        raise KeyboardInterrupt

    previous = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        mode = "CPU" if launch.cpu else "GPU"
        print(f"sglang-ds41 serve: starting SGLang ({mode}), pid {proc.pid}", file=sys.stderr, flush=True)
        ready_s = wait_ready(launch.url, proc, ready_timeout_s)
        print(
            f"sglang-ds41 serve: listening on {launch.url} (OpenAI API: {launch.url}/v1), "
            f"ready after {ready_s:.0f} s",
            flush=True,
        )
        return proc.wait()
    except KeyboardInterrupt:
        return 0 if stopping else 130
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
        code = stop(proc)
        if stopping:
            print(f"sglang-ds41 serve: stopped the server (exit code {code})", file=sys.stderr, flush=True)


def cache_dir() -> Path:
    """Where `serve --tiny` keeps the checkpoint it built ($SGLANG_DS41_CACHE or ~/.cache)."""
    if root := os.environ.get("SGLANG_DS41_CACHE"):
        return Path(root)
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "sglang-ds41"


def tiny_checkpoint(variant: str = "base", engram: str = "fp8", seed: int = 0) -> Path:
    """The tiny checkpoint, built on first use and reused while its generator is unchanged
    (the directory name carries a hash of `checkpoint/tiny.py`)."""
    import hashlib
    import shutil
    import tempfile

    try:
        from sglang_ds41.checkpoint import tiny
    except ImportError as error:
        raise Ds41Error(f"--tiny: the tiny checkpoint builder is not available ({error})") from error
    stamp = hashlib.sha256(Path(tiny.__file__).read_bytes()).hexdigest()[:12]
    target = cache_dir() / f"tiny-{variant}-{engram}-seed{seed}-{stamp}"
    if (target / "config.json").is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    building = Path(tempfile.mkdtemp(prefix=target.name + ".", dir=target.parent))
    try:
        tiny.write_tiny(building, variant=variant, engram=engram, seed=seed)
        building.rename(target)  # atomic: a concurrent build that won leaves target in place
    except OSError:
        if not (target / "config.json").is_file():
            raise
    finally:
        shutil.rmtree(building, ignore_errors=True)
    return target
