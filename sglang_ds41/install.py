"""What a command needs beyond the base install, as the exact pip command for this environment.

The base install (render, parse, agent, inspect, engram-plan) has no torch, numba or sglang.
`model` adds torch and numba (make-tiny, generate, convert-engram); serving on a CPU needs the
`serve` extra plus sglang itself, installed without its CUDA-only dependencies; on GPUs the
`gpu` extra with constraints/gpu-cu13.txt (scripts/setup-gpu.sh). Reads only package metadata.
"""

from __future__ import annotations

import json
import os
import shlex
import sys
from importlib.metadata import PackageNotFoundError, distribution
from urllib.parse import unquote, urlparse

DIST = "sglang-ds41"
# The SGLang release everything here is written and pinned against (the plugin's upstream checks,
# the launcher, the install hints).
SGLANG_VERSION = "0.5.23"
SGLANG = f"sglang=={SGLANG_VERSION}"

# Top-level modules of the extras' packages -> the extra that brings them.
EXTRA_OF_MODULE = {
    "torch": "model",
    "numba": "model",
    "llvmlite": "model",
    "sglang": "serve",
    "torchvision": "serve",
    "triton": "serve",
    "transformers": "serve",
    "xgrammar": "serve",
    "psutil": "serve",
    "zmq": "serve",
    "uvicorn": "serve",
    "fastapi": "serve",
    "deepseek_recipe": "serve",
}


def requirement(extra: str) -> str:
    """This installation of sglang-ds41 with `extra`, as pip is given it: the wheel or checkout it
    was installed from (its direct_url.json), else the project name."""
    try:
        text = distribution(DIST).read_text("direct_url.json")
    except PackageNotFoundError:
        text = None
    if text:
        info = json.loads(text)
        url = info.get("url", "")
        if url.startswith("file://"):
            path = unquote(urlparse(url).path)
            editable = (info.get("dir_info") or {}).get("editable", False)
            if os.path.exists(path):
                return ("-e " if editable else "") + shlex.quote(f"{path}[{extra}]")
    return shlex.quote(f"{DIST}[{extra}]")


def pip() -> str:
    return f"{shlex.quote(sys.executable)} -m pip"


def cpu_serve_command() -> str:
    """The one-liner that makes this environment serve on a CPU."""
    return f"{pip()} install {requirement('serve')} && {pip()} install --no-deps {SGLANG}"


def gpu_serve_command() -> str:
    return f"{pip()} install {requirement('gpu')} -c constraints/gpu-cu13.txt  (scripts/setup-gpu.sh)"


def missing_module_hint(module: str | None) -> str | None:
    """Why a command failed on a missing module of an extra, and what to run; None if not ours."""
    top = (module or "").split(".", 1)[0]
    extra = EXTRA_OF_MODULE.get(top)
    if extra is None:
        return None
    if extra == "model":
        how = f"{pip()} install {requirement('model')}  (or the serve extra, which includes it)"
    else:
        how = f"on a CPU: {cpu_serve_command()}; on NVIDIA GPUs: {gpu_serve_command()}"
    return f"this command needs {top}, which the base install of sglang-ds41 leaves out. Install it: {how}"
