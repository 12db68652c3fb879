"""Launch `python -m sglang.launch_server` for a V4.1 checkpoint with the flags it needs.

Our defaults come first and every flag the user gives replaces ours (same flag, any value
form); anything else passes through to SGLang untouched. Defaults on both engines: the V4.1
reasoning and tool-call parsers, `--served-model-name DeepSeek-V4.1-Flash` (the name the
renderer and the OpenAI clients use) and `--enable-cache-report` (cached-token counts in every
usage). Before anything starts, the checkpoint is validated like `sglang-ds41 inspect` does
(config, index and every shard header, well under a second) and the environment is checked for
sglang and the serve extra, with the exact install command when they are missing. Two engines:

* on a GPU, upstream SGLang's own V4.1 model: a plain launch_server with the V4.1 parsers;
  our SGLang plugin (entry point `sglang.srt.plugins`) gives it the MXFP4 Engram tables;
* on the CPU (no GPU, or `--device cpu`), our own backend: the environment registers our
  models (`SGLANG_EXTERNAL_MODEL_PACKAGE`) and puts `_pythonpath/` (our `sitecustomize`, the
  launch hooks) on PYTHONPATH of every server process, and the settings SGLang 0.5.23 needs
  on a CPU-only machine are added: the CPU engine, the torch_native attention backend, a
  bounded KV pool, the op shim, a scheduler that sleeps while idle (`--sleep-on-idle`), and
  for `--tp N` the per-rank core binding and PyNccl switched off (gloo does the collectives),
  and the model computes in float32 like `sglang-ds41 generate` unless `--dtype` or
  `$SGLANG_DS41_DTYPE` says otherwise. Flags that would lose its state are refused.

The GPU check reads the NVIDIA driver's device files, so the `serve` process itself never
imports torch; `--device` overrides it. SGLang's own output goes to a log file (`--log-file`,
`--verbose` shows it instead); `serve` prints where it is and, once the server answers, one
line with the address and what it serves.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from sglang_ds41.backend import EXTERNAL_MODEL_PACKAGE
from sglang_ds41.cache import cache_dir
from sglang_ds41.encoding.reasoning import THINKING_TOKEN_BUDGET_ENV
from sglang_ds41.errors import Ds41Error
from sglang_ds41.install import SGLANG_VERSION
from sglang_ds41.plugin.serving import prompt_encoding

SERVED_MODEL_NAME = "DeepSeek-V4.1-Flash"  # what `render` and DeepSeek's API call the model
CPU_DTYPE = "float32"  # `sglang-ds41 generate`'s default, so both give the same greedy tokens

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
    served_model_name: str = SERVED_MODEL_NAME

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


def has_gpu(dev: Path = Path("/dev"), proc: Path = Path("/proc/driver/nvidia/gpus")) -> bool:
    """An NVIDIA GPU this process may use, seen without importing torch: the driver's device nodes
    (/dev/nvidia0, ...) or its /proc entries, unless CUDA_VISIBLE_DEVICES hides every device."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None and visible.strip() in ("", "-1", "none", "NoDevFiles"):
        return False
    try:
        if any(re.fullmatch(r"nvidia\d+", entry.name) for entry in dev.iterdir()):
            return True
        return proc.is_dir() and any(proc.iterdir())
    except OSError:
        return False


def take_model_path(args: Sequence[str]) -> tuple[str | None, list[str]]:
    """SGLang's `--model-path DIR` / `--model DIR` (also `=DIR`) out of `args`: (DIR or None, the rest)."""
    found: list[str] = []
    rest: list[str] = []
    i = 0
    while i < len(args):
        flag, eq, value = args[i].partition("=")
        if flag in ("--model-path", "--model"):
            if not eq:
                if i + 1 >= len(args) or args[i + 1].startswith("--"):
                    raise Ds41Error(f"{flag} needs a value: the checkpoint directory")
                i += 1
                value = args[i]
            found.append(value)
        else:
            rest.append(args[i])
        i += 1
    if len(set(found)) > 1:
        raise Ds41Error(f"two checkpoints given: {' and '.join(map(repr, found))}")
    return (found[0] if found else None), rest


def engine_is_cpu(sglang_args: Sequence[str], gpu: bool | None = None) -> bool:
    """Our CPU backend (no GPU, or `--device cpu`), else upstream SGLang's model; `--device` wins."""
    device = flag_value(split_flags(sglang_args), "--device")
    if device is not None:
        return device == "cpu"
    return not (has_gpu() if gpu is None else gpu)


def installed_version(name: str) -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(name)
    except PackageNotFoundError:
        return None


def check_environment(cpu: bool) -> None:
    """Fail before launch, with the exact install command, when this environment cannot serve:
    sglang missing or another release, or (on the CPU) a package of the serve extra missing."""
    from sglang_ds41 import install

    if cpu:
        where = "on this CPU"
        how = (
            f"    {install.cpu_serve_command()}\n"
            "(sglang without its dependencies: its CUDA-only kernels are not needed on a CPU)"
        )
    else:
        where, how = "on NVIDIA GPUs", f"    {install.gpu_serve_command()}"
    found = installed_version("sglang")
    if found is None:
        raise Ds41Error(
            f"SGLang is not installed in this environment ({sys.prefix}). To serve {where}, run:\n{how}"
        )
    if found != SGLANG_VERSION:
        raise Ds41Error(
            f"sglang {found} is installed; sglang-ds41 serves with sglang {SGLANG_VERSION}. "
            f"To serve {where}, run:\n{how}"
        )
    missing = missing_serve_requirements() if cpu else []
    if missing:
        raise Ds41Error(
            "the CPU backend needs the serve extra; not installed or at another version: "
            f"{', '.join(missing)}. Run:\n{how}"
        )


def missing_serve_requirements() -> list[str]:
    """The `serve` extra's requirements (from our own metadata) that are not met here."""
    from importlib.metadata import PackageNotFoundError, distribution

    try:
        requires = distribution("sglang-ds41").requires or []
    except PackageNotFoundError:
        return []  # running from a source tree that was never installed: nothing to compare
    try:
        from packaging.requirements import Requirement
    except ImportError:
        return ["packaging"]
    missing = []
    for text in requires:
        req = Requirement(text)
        in_serve = req.marker is not None and req.marker.evaluate({"extra": "serve"})
        if not in_serve or req.marker.evaluate({"extra": ""}):
            continue
        got = installed_version(req.name)
        if got is None or not req.specifier.contains(got, prereleases=True):
            missing.append(f"{req}" + ("" if got is None else f" (found {got})"))
    return missing


def validate_checkpoint(model_dir: str | Path) -> str:
    """Check the checkpoint as `sglang-ds41 inspect` does, reading only JSON and the shard headers
    (CheckpointError / ConfigError name the file or tensor); returns what it is, in a few words."""
    from sglang_ds41.backend.architectures import V41_SCRIPTED
    from sglang_ds41.checkpoint.reader import Checkpoint, CheckpointError, read_shard_header

    root = Path(model_dir)
    config_path = root / "config.json"
    if not root.is_dir():
        raise CheckpointError(f"{root}: not a directory")
    if not config_path.is_file():
        raise CheckpointError(f"{root} is not a checkpoint directory (no config.json)")
    try:
        config = json.loads(config_path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise CheckpointError(f"config {config_path}: cannot read JSON: {error}") from None
    architectures = config.get("architectures") if isinstance(config, dict) else None
    if architectures == [V41_SCRIPTED]:  # the test model: not V4.1's layout, only readable shards
        for shard in sorted(root.glob("*.safetensors")):
            read_shard_header(shard)
        return "the scripted test model"
    ckpt = Checkpoint.open(root)
    try:
        manifest = ckpt.manifest
        return f"{manifest.variant} release, {manifest.engram_format} Engram tables, {len(manifest)} tensors"
    finally:
        ckpt.close()


def check_port_free(host: str, port: int) -> None:
    """Refuse a port something already listens on: SGLang would fail to bind it only after loading
    the model, and meanwhile the server already there would answer the readiness checks."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn binds
        try:
            sock.bind((host, port))
        except OSError as error:
            busy = " (another server is listening there: stop it or pick another --port)"
            raise Ds41Error(
                f"cannot listen on {host}:{port}: {error.strerror}"
                + (busy if error.errno == errno.EADDRINUSE else "")
            ) from None


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
    """The `--tokenizer-path` to give SGLang: None when the checkpoint ships its tokenizer, else
    the packaged V4.1 one's folder (`checkpoint.load.tokenizer_json`)."""
    from sglang_ds41.checkpoint.load import tokenizer_json

    found = tokenizer_json(model_dir)
    return None if found == model_dir / "tokenizer.json" else found.parent


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
    thinking_token_budget: int | None = None,
    incremental_encoding: bool = True,
) -> Launch:
    """The server command and environment for `model_dir`; `gpu=None` looks for a GPU (`has_gpu`);
    `thinking_token_budget` is the server's default (`plugin/serving/thinking.py` reads it per request);
    `incremental_encoding=False` turns the plugin's incremental prompt encoder off
    (`plugin/serving/prompt_encoding.py`).

    The engine follows the device: on a GPU upstream SGLang's own V4.1 model (our plugin adds
    the MXFP4 Engram tables; SGLang loads it through its entry point), on the CPU (no GPU, or
    `--device cpu`) our own backend with the CPU settings.
    """
    model = Path(model_dir)
    if not (model / "config.json").is_file():
        raise Ds41Error(f"{model} is not a checkpoint directory (no config.json)")
    user = split_flags(sglang_args)
    if flag_value(user, "--model-path") is not None:
        other = flag_value(user, "--model-path")
        raise Ds41Error(f"the checkpoint is given twice: {model} and --model-path {other}")
    cpu = engine_is_cpu(sglang_args, gpu)

    defaults: list[list[str]] = [
        ["--model-path", str(model)],
        ["--host", DEFAULT_HOST],
        ["--port", str(DEFAULT_PORT)],
        ["--reasoning-parser", "deepseek-v41"],
        ["--tool-call-parser", "deepseekv41"],
        ["--served-model-name", SERVED_MODEL_NAME],
        ["--enable-cache-report"],
        # Image patches from SGLang's PIL path, bit for bit the reference's (docs/MODEL.md §7.1),
        # on both engines; its Rust resizer ("auto") can differ by one grey level on strong downscales.
        ["--image-processor-backend", "pil"],
    ]
    if (tok := tokenizer_dir(model)) is not None:
        defaults.append(["--tokenizer-path", str(tok)])
    # DeepSeek's API (and deepseek-recipe) think unless told not to; SGLang's default is off.
    env = {"SGLANG_DEFAULT_THINKING": os.environ.get("SGLANG_DEFAULT_THINKING", "1")}
    if thinking_token_budget is not None:
        backend = flag_value(user, "--grammar-backend")
        if backend not in (None, "xgrammar"):
            raise Ds41Error(
                f"--thinking-token-budget is enforced through the xgrammar grammar backend's token "
                f"filter; --grammar-backend {backend} has none"
            )
        env[THINKING_TOKEN_BUDGET_ENV] = str(thinking_token_budget)
    if incremental_encoding:
        prompt_encoding.check_environment(os.environ)  # a bad value stops here, not at a request
    else:
        env[prompt_encoding.SWITCH_ENV] = "0"
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
        served_model_name=flag_value(merged, "--served-model-name") or SERVED_MODEL_NAME,
    )


def _own_backend(
    defaults: list[list[str]], user: Sequence[Sequence[str]], cpus: Sequence[int] | None
) -> tuple[list[list[str]], dict[str, str]]:
    """Flags and environment of our CPU engine: our model package, its launch hooks, CPU settings."""
    defaults = [
        *defaults,
        # Ratio-2 layers keep one compressed entry per token pair at slot // 2 (backend/kv_state.py).
        ["--page-size", "2"],
        ["--device", "cpu"],
        ["--attention-backend", "torch_native"],
        ["--max-total-tokens", str(CPU_MAX_TOTAL_TOKENS)],
        ["--mem-fraction-static", "0.3"],
        # SGLang's scheduler polls its sockets without pause; idle, that is a whole core (98%
        # measured on the tiny model). With this it waits on them (~1% idle, no added latency).
        ["--sleep-on-idle"],
    ]
    pythonpath = os.pathsep.join(p for p in (str(PYTHONPATH_DIR), os.environ.get("PYTHONPATH")) if p)
    env = {
        **(
            {"SGLANG_DS41_DTYPE": CPU_DTYPE}
            if "SGLANG_DS41_DTYPE" not in os.environ and flag_value(user, "--dtype") is None
            else {}
        ),
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


BIND_FAILED = "error while attempting to bind on address"


def read_tail(path: Path | None, nbytes: int = 64 * 1024) -> str:
    """The last `nbytes` of a log as text ('' when there is none), however long the log grew."""
    if path is None:
        return ""
    try:
        with open(path, "rb") as f:
            f.seek(max(0, f.seek(0, os.SEEK_END) - nbytes))
            return f.read().decode("utf-8", errors="replace")
    except OSError:
        return ""


def log_excerpt(path: Path | None, max_lines: int = 40) -> str:
    """What a reader needs from a failed server's log: its last traceback (SGLang's launcher
    then kills its children, so that is where the cause is), else its last lines."""
    lines = read_tail(path).splitlines()
    starts = [
        i for i, line in enumerate(lines) if line.lstrip().startswith("Traceback (most recent call last)")
    ]
    picked = lines[starts[-1] :] if starts else lines
    return "\n".join(picked[-max_lines:])


def wait_ready(url: str, proc: subprocess.Popen, timeout_s: float, log_path: Path | None = None) -> float:
    """Seconds until GET /health_generate answers 200; raises if the server dies, cannot bind
    its port or times out (with the cause from its log when it goes to `log_path`)."""
    t0 = time.monotonic()
    where = f"; its log: {log_path}" if log_path is not None else " (its log above says why)"
    while time.monotonic() - t0 < timeout_s:
        if proc.poll() is not None:
            excerpt = log_excerpt(log_path)
            raise Ds41Error(
                f"the server exited with code {proc.returncode} before it was ready{where}"
                + (f"\n{excerpt}" if excerpt else "")
            )
        if log_path is not None and BIND_FAILED in read_tail(log_path, 4096):
            raise Ds41Error(f"{url}: the port is in use (SGLang could not bind it); pick another with --port")
        try:
            with urllib.request.urlopen(url + "/health_generate", timeout=10) as reply:
                if reply.status == 200:
                    return time.monotonic() - t0
        except (urllib.error.URLError, OSError):
            pass
        time.sleep(0.5)
    raise Ds41Error(f"the server at {url} was not ready after {timeout_s:.0f} s{where}")


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


def engine_name(launch: Launch) -> str:
    return "sglang-ds41 CPU backend" if launch.cpu else "upstream SGLang + sglang-ds41 plugin"


def serve(
    launch: Launch,
    ready_timeout_s: float = 600.0,
    *,
    log_path: str | Path | None = None,
    serving: str = "",
) -> int:
    """Run the server in the foreground until it exits or we get SIGINT/SIGTERM.

    With `log_path`, SGLang's own output (its import warnings, the arguments dump, health-poll
    lines, request logs) goes to that file and the terminal gets two lines: where it starts and,
    once it answers, where it listens and what it serves (`serving`). Without, it is shown as is.
    """
    log = Path(log_path) if log_path is not None else None
    if log is not None:
        log.parent.mkdir(parents=True, exist_ok=True)
        with open(log, "wb") as out:
            proc = start(launch, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    else:
        proc = start(launch)
    stopping = False

    def on_signal(signum, frame):
        nonlocal stopping
        stopping = True
        raise KeyboardInterrupt

    previous = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        log_text = f"; log: {log}" if log is not None else ""
        starting = f"starting SGLang {SGLANG_VERSION} ({engine_name(launch)}), pid {proc.pid}{log_text}"
        print(f"sglang-ds41 serve: {starting}", file=sys.stderr, flush=True)
        ready_s = wait_ready(launch.url, proc, ready_timeout_s, log)
        what = f"{launch.served_model_name}" + (f" ({serving})" if serving else "")
        print(
            f"sglang-ds41 serve: ready after {ready_s:.0f} s: {what} at {launch.url}/v1",
            flush=True,
        )
        code = proc.wait()
        if code != 0 and not stopping and log is not None:
            excerpt = log_excerpt(log)
            print(
                f"sglang-ds41 serve: the server exited with code {code}; log: {log}\n{excerpt}",
                file=sys.stderr,
            )
        return code
    except KeyboardInterrupt:
        return 0 if stopping else 130
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
        code = stop(proc)
        if stopping:
            print(f"sglang-ds41 serve: stopped the server (exit code {code})", file=sys.stderr, flush=True)


def default_log_path(port: int) -> Path:
    """Where `serve` writes SGLang's output unless told (`--log-file`): one file per port."""
    return cache_dir() / "logs" / f"serve-{port}.log"


def versions() -> str:
    """`sglang-ds41 --version`: ours and what serving uses, from package metadata (nothing imported)."""
    parts = [f"{name} {installed_version(name) or 'not installed'}" for name in ("sglang", "torch")]
    return f"sglang-ds41 {installed_version('sglang-ds41') or '(not installed)'} ({', '.join(parts)})"
