"""Our architectures resolve to our classes inside SGLang (config loader + model registry),
checked in fresh interpreters set up the way `sglang-ds41 serve` sets up the server."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from sglang_ds41.serve import launcher as serve

pytestmark = pytest.mark.integration

FIXTURES = Path(__file__).parent.parent / "fixtures"

PROBE = """
import json, sys
from sglang.srt.utils.hf_transformers import get_config
config = get_config(sys.argv[1], trust_remote_code=False)
out = {"architectures": list(config.architectures)}
if sys.argv[2] == "resolve":
    from sglang.srt.models.registry import ModelRegistry
    cls, arch = ModelRegistry.resolve_model_cls(config.architectures)
    out.update(module=cls.__module__, name=cls.__name__)
    try:
        cls(config)
    except Exception as e:
        out["error"] = f"{type(e).__name__}: {e}"
print(json.dumps(out))
"""


def probe(model_dir: Path, patched: bool) -> dict:
    launch = serve.build_launch(model_dir, gpu=False)
    env = {**os.environ, **launch.env}
    if not patched:  # drop our sitecustomize folder (the first PYTHONPATH entry)
        env["PYTHONPATH"] = os.pathsep.join(env["PYTHONPATH"].split(os.pathsep)[1:])
    argv = [sys.executable, "-c", PROBE, str(model_dir), "resolve" if patched else "config"]
    done = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def official_dir(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("official")
    shutil.copyfile(FIXTURES / "official_config.json", out / "config.json")
    return out


def test_official_config_resolves_to_our_backend(official_dir):
    got = probe(official_dir, patched=True)
    assert got["architectures"] == ["DeepseekV41ForCausalLM"]
    assert (got["module"], got["name"]) == ("sglang_ds41.backend.model", "DeepseekV41ForCausalLM")
    # built outside a server it cannot find the server's arguments (model path, page size)
    assert "server args" in got["error"]


def test_without_our_patch_sglang_renames_v41_to_its_own_v4_model(official_dir):
    # why launch_hooks exists: SGLang 0.5.23 maps our architecture to its CUDA-only V4 model
    assert probe(official_dir, patched=False)["architectures"] == ["DeepseekV4ForCausalLM"]


def test_scripted_config_resolves_to_the_scripted_model(tmp_path):
    from sglang_ds41.checkpoint.scripted import write_scripted_checkpoint

    got = probe(write_scripted_checkpoint(tmp_path / "scripted"), patched=True)
    assert (got["module"], got["name"]) == ("sglang_ds41.backend.scripted", "DeepseekV41ScriptedForCausalLM")


GEOMETRY_PROBE = """
import json, sys
from sglang.srt.configs.model_config import ModelConfig
out = {}
for dtype in ("bfloat16", "float32"):
    for disable in (False, True):
        c = ModelConfig(sys.argv[1], dtype=dtype, disable_hybrid_swa_memory=disable)
        out[f"{dtype} disable={disable}"] = {
            "hybrid": bool(c.is_hybrid_swa), "compress": bool(c.is_hybrid_swa_compress),
            "k": c.head_dim, "v": c.v_head_dim, "swa_k": c.swa_head_dim, "swa_v": c.swa_v_head_dim,
            "heads_tp4": c.get_num_kv_heads(4), "swa_heads_tp4": c.get_swa_num_kv_heads(4),
        }
print(json.dumps(out))
"""


def test_sglang_sizes_and_allocates_its_pools_as_our_slot_rows(official_dir):
    """With the hybrid sliding-window pool, SGLang's ModelConfig (which its pool sizing and pool
    construction read) describes one K row per token of our packed rows and no V rows: 894 B
    full side, 528 B of window per SWA layer (official dims), in elements of the model dtype;
    with that pool disabled it keeps SGLang's own geometry (the state is then allocated by us)."""
    env = {**os.environ, **serve.build_launch(official_dir, gpu=False).env}
    done = subprocess.run(
        [sys.executable, "-c", GEOMETRY_PROBE, str(official_dir)],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    got = json.loads(done.stdout.strip().splitlines()[-1])
    ours = {"hybrid": True, "compress": True, "v": 0, "swa_v": 0, "heads_tp4": 1, "swa_heads_tp4": 1}
    assert got["bfloat16 disable=False"] == {**ours, "k": 894 // 2, "swa_k": 528 // 2}
    assert got["float32 disable=False"] == {**ours, "k": 224, "swa_k": 132}  # 896 B, 528 B
    own = got["bfloat16 disable=True"]  # config.json's head_dim 512, V rows as SGLang reads them
    assert (own["hybrid"], own["compress"], own["k"]) == (False, False, 512) and own["v"] > 0
