"""What the two tiny-server examples share: finding the server and its checkpoint, and the
dtypes the reference can be asked to compute in (the server's: `SGLANG_DS41_DTYPE`)."""

from __future__ import annotations

import json
import urllib.request

import torch

DTYPES = {"float32": torch.float32, "float64": torch.float64, "bfloat16": torch.bfloat16}


def server_root(base_url: str) -> str:
    """The server's own address from its OpenAI API base URL (http://host:port/v1)."""
    if not base_url.rstrip("/").endswith("/v1"):
        raise SystemExit(
            f"--base-url {base_url}: give the OpenAI API URL, ending in /v1 (as for the openai client)"
        )
    return base_url.rstrip("/")[: -len("/v1")]


def served_model_dir(root: str) -> str:
    """The checkpoint directory the server reports serving (`/model_info`)."""
    with urllib.request.urlopen(f"{root}/model_info", timeout=60) as reply:
        return json.loads(reply.read())["model_path"]
